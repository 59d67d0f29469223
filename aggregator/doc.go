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
// partitions numbered p — one "slot" — must belong to the same member. The group uses
// kgo.RangeBalancer: per topic it gives member i (members sorted) the i-th contiguous range
// of partitions, which for topics with equal partition counts and the same subscribers is
// the same set of partition numbers on every topic (Kafka Streams relies on the same
// property for co-partitioning). The sticky and round-robin balancers do not have it. The
// aggregator logs an error when matched topics have different partition counts. KafkaOpts
// must not change the balancer.
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
// to the high watermark listed at assignment. While any partition of a slot replays, or a
// partition is revoked, Ready reports false and nothing is published for the slot's keys;
// when the replay ends every key of the slot is published. With the eager range balancer
// each rebalance revokes everything before assigning: partitions that come back to the same
// member continue from their position with their state, slots that lose a partition are
// dropped and every remaining partition of the slot is replayed again; lost partitions
// (session expiry) are dropped at once. A killed instance, a restarted one, or a member
// joining or leaving therefore ends up publishing what a never-interrupted instance would.
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
// first; the others stay due. A counter whose count reaches zero gets a tombstone (null
// value, if a count had been published) and is forgotten.
//
// # Heartbeats
//
// Every HeartbeatInterval (default 500 ms), for each assigned hits partition, the aggregator
// writes a topics.Heartbeat under topics.HeartbeatKey(topic, partition) to every partition
// of the counts topic, so that a reader of any counts partition can tell an idle pipeline
// from a broken one and measure lag: AsOf is the aggregator's clock, Offset the next offset
// to consume, HighWatermark the last one seen, Replaying whether the partition's counts are
// held back.
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
// Counters are bounded by MaxKeys: hits of new counters beyond it are dropped and counted in
// refused_keys_total (non-zero counters are never evicted, since that would publish a wrong
// count; zero counters are forgotten as soon as they are tombstoned). A hit stamped more than
// a quarter window (or MaxClockSkew) ahead of the clock is counted in the furthest future
// bucket the ring holds. A counter whose hits all left the window while no instance owned its
// partition is never seen again by the next owner, so its last count is not tombstoned:
// readers must treat a count whose AsOf + Window has passed as zero. The counts topic's key
// is the counter key alone, so two windows on one key would overwrite each other there:
// counter keys should name their window. The emission loop visits every counter each
// EmitInterval (a compare per idle counter), which is a few milliseconds at a million.
package aggregator
