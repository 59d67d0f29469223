// Package topics is streamlimit's Kafka contract: the names and configurations of the hits
// and counts topics, and the Hit, hit batch, site heartbeat and leave, Count and Heartbeat
// records with their versioned binary and JSON encodings. It has no Kafka client: package
// topicadmin creates and verifies the topics.
//
// Every other package (producer, aggregator, enforcer, the CLI) and every non-Go service
// that publishes hits or reads counts depends on what is written here, so a change to a
// record layout needs a new version byte, never a silent edit of an existing one. A record
// that breaks the limits is rejected with an error wrapping one of the Err* sentinels;
// Reason maps it to a short metric label. Keys starting with ReservedPrefix are
// streamlimit's own (HitBatchKey, SiteHeartbeatKey, SiteLeaveKey, HeartbeatKey); a site
// may sign its records (HeaderSiteMAC, SiteMAC).
//
// Every record, field by field, with examples: docs/records.md.
package topics
