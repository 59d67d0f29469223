// Package topics is streamlimit's Kafka contract: the names and configurations of the hits
// and counts topics, the Hit, Count and Heartbeat records with their versioned binary and
// JSON encodings. It has no Kafka client: package topicadmin creates and verifies the
// topics.
//
// Every other package (producer, aggregator, enforcer, the CLI) and every non-Go service that
// publishes hits or reads counts depends on what is written here, so a change to a record
// layout needs a new version byte, never a silent edit of an existing one.
//
// # Hit records (topic "hits", and "<dc>.hits" replicated from other data centers)
//
// The record key is the counter key; the value is a Hit in one of two encodings, told apart
// by the first byte:
//
//   - Binary, written by streamlimit's producer. Byte 0 is the version. Then, as unsigned
//     varints: key length, site length; then the key bytes and the site bytes; then a
//     signed varint bucket start (unix milliseconds), an unsigned varint window
//     (milliseconds, ≥ 1) and an unsigned varint count. Version 1 ends there and its count
//     is ≥ 1. Version 2 adds an unsigned varint denied count (requests refused at the site
//     in that bucket); count and denied may each be 0 but not both. Nothing may follow.
//     The producer writes version 1 whenever denied is 0, so older aggregators keep
//     reading the hits that count.
//   - JSON, first byte '{', for any producer in any language:
//     {"key":"api|user=42#60s","site":"eu-1","ts":1763740000123,"w":60000,"n":1}
//     key, site and ts are required; w (window in ms) may be left out and the aggregator's
//     default window applies; n defaults to 1 (0 when only "d" is given); "d" is the
//     optional denied count. Unknown fields are ignored so that newer producers can add
//     fields.
//
// Limits: key 1..1024 bytes of valid UTF-8 and not starting with ReservedPrefix, site
// 1..128 bytes of valid UTF-8, count and denied ≥ 0 with count + denied ≥ 1, window ≥ 1 ms
// when present. The aggregator also rejects a ts outside its clock skew bound. A record that
// breaks any of these is rejected with an error that wraps one of the Err* sentinels below;
// Reason maps it to a short metric label.
//
// Denied requests count toward nothing; they tell the other sites where a key is in demand,
// so that a site where a client has just arrived gets its share of the client's room
// (package enforcer).
//
// # Hit batches (in the hits topics)
//
// A record keyed HitBatchKey ("__streamlimit/hits") holds several hits of one site:
// binary version 3, then as an unsigned varint the site's length and the site, then one
// hit or more until the end of the value, each an unsigned varint key length, the key, a
// signed varint bucket start, and unsigned varints window (≥ 1), count and denied (count +
// denied ≥ 1). Every hit obeys the limits above, and its key is owned by the record's
// partition (Kafka's default placement of the key, as for a hit record of its own); an
// aggregator re-routes a hit that is not, as it would its record. A batch that breaks the
// format anywhere is skipped whole. streamlimit's producer writes them because Kafka's
// costs, the client's and the broker's, are per record: a hit record of a key hit a few
// times a second is a record on its own, a batch of a flush's hits for one partition costs
// about what one hit record does. Aggregators older than this version skip a batch as an
// unknown version, so they must be upgraded before producers write batches
// (producer.Config.SingleHitRecords keeps the old records meanwhile). There is no JSON
// form: producers in other languages write hit records of their own.
//
// # Site heartbeats (in the hits topics)
//
// A hit whose key is SiteHeartbeatKey ("__streamlimit/alive") carries no hits: it says that
// its site is alive and has handed to Kafka every hit of its buckets that started before its
// ts. The producer writes one to every partition of its hits topic about twice a second
// (binary version 2 with window 0 and counts 0; JSON {"key":"__streamlimit/alive",
// "site":"eu-1","ts":1763740000000}). Replication carries them like any hit, so each data
// center's aggregator knows, per site, how far its view of that site reaches, and publishes
// it in its heartbeats (Heartbeat.Sites). A site that stops sending them is, after a bound,
// no longer taken for idle by enforcers.
//
// A producer instance that stops cleanly writes a site leave record, key SiteLeaveKey
// ("__streamlimit/leave"), encoded as a heartbeat is, to every partition after its last
// hits: {"key":"__streamlimit/leave","site":"eu-1","ts":1763740000000,"instance":"pod-7"}.
// When every instance of the site heard from on a partition has left, the aggregators list
// the site as left (Heartbeat.Left) instead of heard, and enforcers stop reserving anything
// for it; a heartbeat of the site (a restart under the same name) makes it live again.
// A leave counts only from an instance heard heartbeating under its site on that
// partition, and a site record dated more than MaxSiteRecordAhead ahead of the
// aggregator's clock is refused: neither a stranger's leave nor one dated ahead can
// override the site's own heartbeats.
//
// # Site signatures (a header of any hits-topic record)
//
// Whoever may write a hits topic may write any site's name in a record. With site keys
// configured, every record a producer writes (hit, hit batch, heartbeat, leave) carries the
// header HeaderSiteMAC, the HMAC-SHA256 of the record's value under its site's key
// (SiteMAC), and an aggregator given the keys (SiteKeys) skips and counts a record without
// it ("unsigned"), with one that does not match ("bad_signature") or naming a site it has
// no key for ("unknown_site"). The value's format does not change: readers without keys
// ignore the header, so signing producers and verifying aggregators are upgraded apart
// (producers first, then aggregators turn verification on).
//
// # Count records (topic "counts", compacted)
//
// The record key is the counter key; a null value (tombstone) means the count fell to zero.
// Binary version 2: version byte 2, unsigned varint key length, key, unsigned varint window
// (ms), signed varint as-of (unix ms), unsigned varint sub-bucket count (the aggregator's
// split of the window, 0 when unstated), total as 8 bytes IEEE-754 little endian, unsigned
// varint number of sites, then per site an unsigned varint length, the site, its count and
// its demand, each as 8 bytes IEEE-754 little endian. Sites are sorted by name and unique.
// Version 1 (still decoded) has no sub-bucket count and no demand. JSON:
// {"key":"...","w":60000,"asof":1763740000123,"total":6.5,"sub":60,"sites":{"eu-1":3.5,"us-1":3},"demand":{"eu-1":2.1,"us-1":0.4}}
// ("sub" and "demand" may be absent). Counts are fractional because the sliding-window
// estimate interpolates the oldest sub-window. Demand is the site's requests, admitted or
// denied, each weighted by e^(−age/τ), τ = DemandTimeConstant (1 s): demand / τ is the
// site's recent request rate.
//
// # Heartbeats
//
// Keys that start with ReservedPrefix are streamlimit's own. The aggregator writes Heartbeat
// records under HeartbeatKey(topic, partition) so that a reader of the counts topic can tell
// an idle pipeline from a broken one and measure its lag.
package topics
