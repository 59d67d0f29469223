// Package aggregator turns the hits topics of every data center into absolute sliding-window
// counts per counter key, with a per-site breakdown, on the compacted counts topic.
//
// An Aggregator is one member of a Kafka consumer group over the local hits topic and its
// MirrorMaker-2 copies ("hits", "us.hits", ..., by list or pattern). For each counter — a
// (key, window) pair — and each site it keeps a ring of sub-window buckets (package
// window, which defines the counting rule exactly), and publishes the counter's
// count at the aggregator's clock (topics.Count, binary encoding, AsOf = the instant the
// count was computed for) keyed by the counter key.
//
// # One key, one owner (docs/architecture.md, invariant 2)
//
// Our producer partitions hits by key with Kafka's murmur2 partitioner, and every hits topic
// has the same partition count (MirrorMaker 2 keeps partition numbers), so all hits of a key
// are on partition p of every hits topic. The count is the union over those topics, so all
// partitions numbered p — one "slot" — must belong to the same member. The group's balancer
// (balancer.go, protocol BalancerProtocol) hands out slots, not partitions: the owner of
// slot p is assigned partition p of every hits topic. It is cooperative (KIP-429): a
// rebalance moves only the slots that change hands, a slot that moves is taken from its
// owner in one round and given to its new owner in the next, once nobody holds any of it,
// and the other members go on counting and publishing throughout. Kafka's range balancer
// keeps slots together only because it is eager (every rebalance stops every member), and
// franz-go's cooperative-sticky balancer balances each partition apart. The aggregator logs
// an error when matched topics have different partition counts. KafkaOpts must not change
// the balancer.
//
// A hit can still arrive on the wrong partition when some foreign producer uses another
// partitioner. Counting it there would give two instances competing partial counts for one
// key. So a hit without the topics.HeaderRerouted header whose key's murmur2 partition q
// differs from the partition p it arrived on is not counted: it is re-published to partition
// q of the same topic, with its original value and timestamp and the header set to
// "<topic>/<p>/<offset>" of the original. A record carrying the header is counted wherever
// it arrives and never re-routed again. The copy is itself a record in the log, so the state
// stays a function of the log: on replay the misrouted original is skipped by the same rule
// and the copy counted by the owner. A crash between re-publishing and moving on makes the
// original be re-routed again after recovery, so there may be several copies of one
// original; the owner counts only the first copy of each origin, remembering origins per
// slot until the hit is older than its window plus Lateness (bounded by MaxKeys, counted in
// rerouted_duplicates_total). Because the copies carry the original's timestamp, a replay
// that seeks by time sees either all copies of an origin within the window or none.
//
// # Recovery (docs/architecture.md, invariant 1)
//
// Counts are absolute, so state can be rebuilt from the log instead of stored. The
// aggregator never commits offsets (auto-commit is off): when a partition is assigned it
// seeks to the first offset whose timestamp is at or after now − MaxWindow − Lateness
// (ListOffsets by time; the hits topic uses CreateTime, the producer's clock) and replays up
// to the high watermark listed at assignment. While any partition of a slot replays, Ready
// reports false and nothing is published for the slot's keys; when the replay ends every
// key of the slot is published. That holds on every path a partition arrives by: a first
// assignment, a slot handed over in a rebalance, a static member's restart, and an
// assignment that reaches a member already leaving (it is never published). A member that
// gives a slot up (revoked) first publishes what is due and a last heartbeat of it and
// flushes them, so that none of its records lands after the next owner's; lost partitions
// (the session expired: another member may own them already) are dropped at once. On
// shutdown Run publishes and flushes, then leaves the group with a LeaveGroup of its own,
// before anything can make it wait (group.go). A killed instance, a restarted one, or a
// member joining or leaving therefore ends up publishing what a never-interrupted instance
// would.
//
// InstanceID, when set, makes the member static (Kafka's group.instance.id): a restart
// under the same id within SessionTimeout gets its slots back without a rebalance. Every
// group event is logged and counted: group_events_total and group_partitions_total
// (assigned, revoked, lost, a rebalance waiting for members, left), the JoinGroup times,
// replays (replaying_partitions, replay_duration_seconds), and newest_count_age_seconds.
//
// # Emission
//
// Every EmitInterval the aggregator selects the due counters: those with new hits whose last
// emission is at least EmitInterval old, and those whose decay re-evaluation time has come
// (every max(bucket width, EmitInterval) while the count is non-zero, since the count falls
// as the window slides). A re-evaluation that finds the value unchanged publishes nothing,
// unless the last publication is half a window old: readers take a count whose window has
// passed since its as-of time for gone, so steady counts are refreshed.
// At most MaxEmitPerSecond × EmitInterval records go out per round, the largest changes
// first; the others stay due, ranked by their change when they were found due, and go out
// in that order in the next rounds (a backlog, such as a replay's end, is ranked once, not
// in every round). A counter whose count reaches zero gets a tombstone (null
// value, if a count had been published) and is forgotten.
//
// # Heartbeats
//
// Every HeartbeatInterval (default 500 ms), for each assigned hits partition, the aggregator
// writes a topics.Heartbeat under topics.HeartbeatKey(topic, partition) to every partition
// of the counts topic, so that a reader of any counts partition can tell an idle pipeline
// from a broken one and measure lag: AsOf is the aggregator's clock, Offset the next offset
// to consume, HighWatermark the last one seen. A partition that replays gets no heartbeat
// (and one as soon as its replay ends): the latest heartbeat of a partition is always from
// an owner whose counts of it are complete, the previous owner's while a new one replays,
// and says how fresh they are. Replaying is therefore never set. A heartbeat round first
// publishes the counts that are due, chosen with the heartbeats, and a site is reported
// left only once no count of the hits read before its leave is still to be published (one
// emission interval after the leave was read, with no backlog): on every counts partition
// the heartbeat that reports a site left follows the counts of its last hits.
//
// # Bad input
//
// Undecodable or invalid hits are skipped and counted in bad_records_total by
// topics.Reason, plus "too_far_future" (bucket start beyond MaxClockSkew of the clock or of
// the record timestamp), "too_old" (older than its window plus Lateness; not counted while
// replaying, where old hits are expected) and "window_too_long" (over MaxWindow). With
// DeadLetterTopic set, each is copied there with a HeaderReason header. The aggregator never
// stops on bad input.
//
// # Limits
//
// Counters are bounded by MaxKeys: a new counter beyond it takes the place of the least
// recently hit of a sample of 16 (evicted_keys_total), so that a new key is always counted.
// Nothing is published on eviction: the evicted counter's last count stays in the
// enforcers' snapshots until its window has passed, as if its key had gone quiet, where a
// tombstone would free its client at once. A hit stamped more than
// a quarter window (or MaxClockSkew) ahead of the clock is counted in the furthest future
// bucket the ring holds. A counter whose hits all left the window while no instance owned its
// partition is never seen again by the next owner, so its last count is not tombstoned:
// readers must treat a count whose AsOf + Window has passed as zero. The counts topic's key
// is the counter key alone, so two windows on one key would overwrite each other there:
// counter keys should name their window. The emission loop visits every counter each
// EmitInterval (a compare per idle counter), which is a few milliseconds at a million.
package aggregator
