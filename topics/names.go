package topics

import (
	"regexp"
	"strings"
)

// Default topic names.
const (
	// DefaultHitsTopic is the local data center's hits topic.
	DefaultHitsTopic = "hits"
	// DefaultCountsTopic is the compacted topic of absolute sliding-window counts.
	DefaultCountsTopic = "counts"
)

// RemoteHitsTopic returns the name that MirrorMaker 2's default replication policy gives
// to topic hits replicated from the cluster alias dc: "<dc>.<hits>".
func RemoteHitsTopic(dc, hits string) string { return dc + "." + hits }

// HitsPattern returns a regular expression (Kafka consumer pattern syntax, anchored) that
// matches the local hits topic and every MirrorMaker-2 copy of it, "hits" and "<dc>.hits".
// Data center aliases may hold letters, digits, '_' and '-'.
func HitsPattern(hits string) string {
	return `^([A-Za-z0-9_-]+\.)?` + regexp.QuoteMeta(hits) + `$`
}

// SiteOfTopic returns the data center alias of a MirrorMaker-2 replicated hits topic
// ("us" for "us.hits") and "" for the local hits topic itself.
func SiteOfTopic(topic, hits string) string {
	if topic == hits {
		return ""
	}
	dc, ok := strings.CutSuffix(topic, "."+hits)
	if !ok {
		return ""
	}
	return dc
}
