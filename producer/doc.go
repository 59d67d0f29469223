// Package producer publishes hits to streamlimit's Kafka hits topic without ever slowing
// the request that records them.
//
// # Model
//
// A Producer counts hits in memory per counter — a (key, window) pair, since several limits
// on one client (3/min and 10/h) are separate counters — and per time bucket: the bucket of
// a hit at time t starts at t truncated to a multiple of Config.BucketWidth (default
// 100 ms) since the Unix epoch, on the Producer's clock. A background flush every
// Config.FlushInterval (default 10 ms, ticking just after bucket ends) turns each finished
// bucket's count into one topics.Hit record (Site = Config.Site, BucketStart in unix ms,
// Window in ms, Count ≥ 1), so Kafka traffic grows with the number of active counters, not
// with requests: at most one record per counter per bucket while Kafka keeps up (about 10
// records/s for a counter hit at any rate, with the defaults). The records of one flush
// whose keys one partition owns travel together in hit batches (topics.HitBatchKey, on
// that partition; Config.SingleHitRecords for one Kafka record per count keyed by the
// counter key), because Kafka's costs are per record and per request: a count of a key
// hit a few times a second cost the enforcer about 2 µs and the broker about 1 µs as a
// record of its own. A hit reaches Kafka at most BucketWidth + FlushSpread (default none)
// + FlushInterval (plus Kafka's own latency) after it is recorded. Flush and Close also
// send the current, unfinished buckets; hits that
// arrive in such a bucket afterwards become a second record for it, which consumers add up.
//
// # Methods
//
// New builds a Producer from a Config (its own Kafka client from Config.Brokers, or an
// existing Config.Client) and starts the background flush. Hit(key, window, n) records n
// hits at the clock's current time; HitAt(key, window, t, n) at time t. Both return
// nothing and never fail: invalid input is counted (invalid_hits_total) and ignored, and a
// hit that the memory bound cannot take is counted (dropped_hits_total) and dropped.
// Bulk returns a publisher for hits that arrive in bulk (usage that clients deciding on
// their own report, such as RLQS): its new counters and unsent counts hold at most half of
// Config.MaxBufferedKeys, so that however many counters they bring, the hits of decisions
// keep the other half (dropped_hits_total{reason="bulk_no_room"} counts the excess).
// Flush(ctx) sends everything now and waits for Kafka's acknowledgement; Close(ctx) stops
// the Producer, sends everything and reports, as an *UndeliveredError, the hits it could
// not deliver before ctx was done. Stats returns the counters behind the metrics.
//
// A Producer is safe for simultaneous use by multiple goroutines. Hit and HitAt do no I/O
// and take only a per-shard mutex (64 shards by key hash) that the flush holds for
// in-memory work proportional to the shard's active counters, never while talking to
// Kafka. Once a counter is known and its bucket current, they do not allocate; the key
// string is kept, not copied, so callers should not build it from unsafe byte slices.
//
// # When Kafka is slow or down
//
// Records are handed to the franz-go client with TryProduce, which never blocks: at most
// Config.MaxInFlightRecords records are in the client at once. What does not fit, and what
// the client fails, is kept in the Producer merged per (key, window, bucket), so memory
// grows with distinct counters and buckets, not with hits. Known counters and unsent counts
// count against Config.MaxBufferedKeys. When it is full, a new counter evicts an idle one
// (nothing pending; not recently hit and least hit first), so a flood of new keys evicts its
// own keys and the hits of keys that carry traffic are never dropped; only when every held
// counter has hits not yet handed to Kafka is a new counter's hit dropped, and only when
// Kafka has not taken counts and the buffer is full are those dropped. Every drop is counted
// by reason (dropped_hits_total{reason}: no_room, kafka_backlog, closed, bulk_no_room) and logged at info
// level, at most every 10 s, with the reason. Known counters idle for Config.IdleTimeout
// are evicted. When Kafka comes back, the client's buffered records are delivered by its
// own retries and the kept counts by the next flushes. The client produces idempotently and
// fails a record only when the broker has not written it, so a retried count is never
// delivered twice.
//
// Counts never overflow: a bucket's hits and denials beyond math.MaxInt64 together become
// several records (consumers add them up), and the running totals behind the metrics
// saturate.
//
// # Partitioning
//
// Records are keyed by counter key and placed with Kafka's Java default for keyed records:
// murmur2 of the key bytes, high bit cleared, modulo the partition count
// (kgo.StickyKeyPartitioner(nil)). Producers in other languages must do the same so that
// one aggregator instance owns each key: the Java client does by default; librdkafka-based
// clients (kcat, confluent-kafka-*) need partitioner=murmur2_random. A hit batch holds only
// counts whose keys that placement puts on the batch's partition, which the Producer names
// in the record (it learns the partition count from the first record it places; until
// then, every count is a record of its own).
//
// # Metrics
//
// On Config.Registerer, namespace "streamlimit", subsystem "producer": hits_in_total,
// dropped_hits_total{reason}, invalid_hits_total, records_out_total, hit_batches_out_total, bytes_out_total,
// buffered_keys, unsent_hits, in_flight_records and flush_duration_seconds.
package producer
