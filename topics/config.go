package topics

import (
	"errors"
	"fmt"
	"strconv"
	"time"
)

// Config describes the topics streamlimit needs. The zero value is usable: every field has
// a default, written in its comment, that Normalize fills in.
type Config struct {
	// HitsTopic is the local hits topic. Default DefaultHitsTopic ("hits").
	HitsTopic string
	// CountsTopic is the compacted counts topic. Default DefaultCountsTopic ("counts").
	CountsTopic string
	// HitsPartitions is the number of partitions of the hits topic, which bounds how many
	// aggregator instances share the work. Default 12.
	HitsPartitions int32
	// CountsPartitions is the number of partitions of the counts topic. Default 12.
	CountsPartitions int32
	// ReplicationFactor for created topics; -1 (the default when 0) uses the broker's
	// default.replication.factor.
	ReplicationFactor int16
	// HitsRetention is how long hits are kept. It must be at least twice MaxWindow so that
	// an aggregator can always replay a whole window after a crash. Default 24h.
	HitsRetention time.Duration
	// MaxWindow is the longest window any rule uses; only checked against HitsRetention.
	// Default 1h.
	MaxWindow time.Duration
	// CountsSegment is the counts topic's segment.ms: Kafka compacts only closed segments,
	// so this bounds how long superseded counts linger. Default 1m.
	CountsSegment time.Duration
	// CountsDeleteRetention is the counts topic's delete.retention.ms, how long tombstones
	// stay readable after compaction. Default 10m.
	CountsDeleteRetention time.Duration
	// CountsMaxCompactionLag is max.compaction.lag.ms: a dirty segment is compacted within
	// this even if the dirty ratio is low. Default 5m.
	CountsMaxCompactionLag time.Duration
}

// Defaults of Config.
const (
	// DefaultPartitions is HitsPartitions and CountsPartitions when zero: room for up to 12
	// aggregator instances (docs/scaling.md).
	DefaultPartitions = 12
	// DefaultReplicationFactor is ReplicationFactor when zero: the broker's default.
	DefaultReplicationFactor = -1
	// DefaultHitsRetention is HitsRetention when zero: at least twice DefaultMaxWindow, and
	// a day of history for `streamlimit counts export`.
	DefaultHitsRetention = 24 * time.Hour
	// DefaultMaxWindow is MaxWindow when zero, and the aggregator's longest window.
	DefaultMaxWindow = time.Hour
	// DefaultCountsSegment is CountsSegment when zero.
	DefaultCountsSegment = time.Minute
	// DefaultCountsDeleteRetention is CountsDeleteRetention when zero.
	DefaultCountsDeleteRetention = 10 * time.Minute
	// DefaultCountsMaxCompactionLag is CountsMaxCompactionLag when zero.
	DefaultCountsMaxCompactionLag = 5 * time.Minute
)

// Normalize returns c with defaults filled in, or an error naming the first bad field.
func (c Config) Normalize() (Config, error) {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	if c.HitsTopic == "" {
		c.HitsTopic = DefaultHitsTopic
	}
	if c.CountsTopic == "" {
		c.CountsTopic = DefaultCountsTopic
	}
	if c.HitsPartitions == 0 {
		c.HitsPartitions = DefaultPartitions
	}
	if c.CountsPartitions == 0 {
		c.CountsPartitions = DefaultPartitions
	}
	if c.ReplicationFactor == 0 {
		c.ReplicationFactor = DefaultReplicationFactor
	}
	def(&c.HitsRetention, DefaultHitsRetention)
	def(&c.MaxWindow, DefaultMaxWindow)
	def(&c.CountsSegment, DefaultCountsSegment)
	def(&c.CountsDeleteRetention, DefaultCountsDeleteRetention)
	def(&c.CountsMaxCompactionLag, DefaultCountsMaxCompactionLag)
	var errs []error
	if c.HitsTopic == c.CountsTopic {
		errs = append(errs, fmt.Errorf("topics: hits and counts topic are both %q", c.HitsTopic))
	}
	if c.HitsPartitions < 0 || c.CountsPartitions < 0 {
		errs = append(errs, fmt.Errorf("topics: partitions must be positive (hits %d, counts %d)", c.HitsPartitions, c.CountsPartitions))
	}
	if c.HitsRetention < 2*c.MaxWindow {
		errs = append(errs, fmt.Errorf("topics: hits retention %v is less than twice the longest window %v", c.HitsRetention, c.MaxWindow))
	}
	for name, d := range map[string]time.Duration{"CountsSegment": c.CountsSegment, "CountsDeleteRetention": c.CountsDeleteRetention, "CountsMaxCompactionLag": c.CountsMaxCompactionLag, "MaxWindow": c.MaxWindow} {
		if d < time.Millisecond {
			errs = append(errs, fmt.Errorf("topics: %s %v must be at least 1ms", name, d))
		}
	}
	return c, errors.Join(errs...)
}

// HitsConfigs returns the topic configuration streamlimit creates the hits topic with.
func (c Config) HitsConfigs() map[string]*string {
	return map[string]*string{
		"cleanup.policy": ptr("delete"),
		"retention.ms":   ptr(ms(c.HitsRetention)),
		// Hits are timestamped by the producer; recovery seeks by time, which needs the
		// producer's timestamps in the index, not the broker's arrival time.
		"message.timestamp.type": ptr("CreateTime"),
	}
}

// CountsConfigs returns the topic configuration streamlimit creates the counts topic with:
// compacted, with segments small and cleaning eager enough that superseded counts and
// tombstoned keys disappear within minutes.
func (c Config) CountsConfigs() map[string]*string {
	return map[string]*string{
		"cleanup.policy":            ptr("compact"),
		"segment.ms":                ptr(ms(c.CountsSegment)),
		"min.cleanable.dirty.ratio": ptr("0.01"),
		"delete.retention.ms":       ptr(ms(c.CountsDeleteRetention)),
		"max.compaction.lag.ms":     ptr(ms(c.CountsMaxCompactionLag)),
		"min.compaction.lag.ms":     ptr("0"),
	}
}

func ptr(s string) *string { return &s }

func ms(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }
