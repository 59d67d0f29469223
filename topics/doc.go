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
//   - Binary, written by streamlimit's producer. Byte 0 is the version (1). Then, as
//     unsigned varints: key length, site length; then the key bytes and the site bytes;
//     then a signed varint bucket start (unix milliseconds), an unsigned varint window
//     (milliseconds, ≥ 1) and an unsigned varint count (≥ 1). Nothing may follow.
//   - JSON, first byte '{', for any producer in any language:
//     {"key":"api:POST /articles|user=42","site":"eu-1","ts":1763740000123,"w":60000,"n":1}
//     key, site and ts are required; w (window in ms) may be left out and the aggregator's
//     default window applies; n defaults to 1. Unknown fields are ignored so that newer
//     producers can add fields.
//
// Limits: key 1..1024 bytes of valid UTF-8 and not starting with ReservedPrefix, site
// 1..128 bytes of valid UTF-8,
// count ≥ 1, window ≥ 1 ms when present. The aggregator also rejects a ts outside its clock
// skew bound. A record that breaks any of these is rejected with an error that wraps one of
// the Err* sentinels below; Reason maps it to a short metric label.
//
// # Count records (topic "counts", compacted)
//
// The record key is the counter key; a null value (tombstone) means the count fell to zero.
// Binary v1: version byte 1, unsigned varint key length, key, unsigned varint window (ms),
// signed varint as-of (unix ms), total as 8 bytes IEEE-754 little endian, unsigned varint
// number of sites, then per site an unsigned varint length, the site and its count as 8 bytes
// IEEE-754 little endian. Sites are sorted by name and unique. JSON:
// {"key":"...","w":60000,"asof":1763740000123,"total":6.5,"sites":{"eu-1":3.5,"us-1":3}}.
// Counts are fractional because the sliding-window estimate interpolates the oldest
// sub-window.
//
// # Heartbeats
//
// Keys that start with ReservedPrefix are streamlimit's own. The aggregator writes Heartbeat
// records under HeartbeatKey(topic, partition) so that a reader of the counts topic can tell
// an idle pipeline from a broken one and measure its lag.
package topics
