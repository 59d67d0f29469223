package aggregator

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamlimit/streamlimit/clock"
	"github.com/streamlimit/streamlimit/topics"
	"github.com/streamlimit/streamlimit/window"
)

// DefaultMaxLocalHold is Config.MaxLocalHold when zero: far above the lag a healthy
// replication adds, so that only a stalled replicator (whose lag samples are discarded
// past a few seconds anyway) could make local counts wait that long.
const DefaultMaxLocalHold = 2 * time.Second

// DefaultEmitInterval is Config.EmitInterval's default: a changed counter is published at
// most this long after its hit arrived, which is most of the pipeline's lag.
const DefaultEmitInterval = 100 * time.Millisecond

// DefaultSessionTimeout is Config.SessionTimeout when zero: the least a broker accepts by
// default (group.min.session.timeout.ms). A member that stops without leaving the group
// (killed, crashed, cut off) keeps its slots until its session times out, and nothing of
// theirs is published meanwhile: enforcers take the sites as silent after a few seconds
// and decide those keys on local shares until another member has taken the slots over
// (a group heartbeat interval later) and replayed them, and their counts pass the
// enforcers' staleness bound (--max-staleness, 10 s) if that takes longer than it. So the
// shorter the better, down to what a live member can always keep up: it heartbeats four
// times a second, and one that cannot reach the group coordinator for 6 s (a network blip,
// a stop-the-world pause) is taken for dead, which costs a rebalance and a replay, not a
// wrong count. A restart under the same InstanceID must also come back within it to keep
// its slots without a rebalance.
const DefaultSessionTimeout = 6 * time.Second

// The other defaults of Config, each its field's value when zero.
const (
	// DefaultGroup is the aggregators' consumer group.
	DefaultGroup = "streamlimit-aggregator"
	// DefaultMaxEmitPerSecond caps the count records published per second.
	DefaultMaxEmitPerSecond = 50_000
	// DefaultMaxKeys bounds the counters held, as the enforcers' structures are bounded.
	DefaultMaxKeys = 1 << 20
	// DefaultHeartbeatInterval is the period of the aggregator's heartbeats.
	DefaultHeartbeatInterval = 500 * time.Millisecond
	// DefaultLateness is how late a hit may arrive and still count.
	DefaultLateness = 5 * time.Second
	// DefaultMaxClockSkew is how far ahead of the aggregator's clock a hit may be stamped.
	DefaultMaxClockSkew = 30 * time.Second
	// DefaultDefaultWindow is the window of JSON hits that give none.
	DefaultDefaultWindow = time.Minute
	// DefaultMetadataMaxAge is how soon a new hits topic matching the pattern is read.
	DefaultMetadataMaxAge = 10 * time.Second
	// DefaultSiteForget is how long a silent site is remembered.
	DefaultSiteForget = 15 * time.Minute
)

// Config configures an Aggregator. Every zero field takes the default written in its comment.
type Config struct {
	// Brokers are the Kafka seed brokers (host:port). Required unless KafkaOpts seeds them.
	Brokers []string
	// Group is the consumer group id. Default DefaultGroup.
	Group string
	// SessionTimeout is how long the group waits for a member that stopped without leaving
	// before its slots go to the others, and how long a member restarted with the same
	// InstanceID may take to come back without a rebalance. It must lie within the
	// brokers' group.min.session.timeout.ms and group.max.session.timeout.ms (6 s and
	// 30 min by default). Default DefaultSessionTimeout.
	SessionTimeout time.Duration
	// Topics lists the hits topics to consume. When empty, TopicPattern is used.
	Topics []string
	// TopicPattern is a regular expression (Kafka consumer pattern, anchored by the caller)
	// of hits topics to consume when Topics is empty. Default topics.HitsPattern("hits"):
	// "hits" and every MirrorMaker-2 copy "<dc>.hits". Every matched topic must have the same
	// partition count (docs/aggregator.md).
	TopicPattern string
	// CountsTopic is the compacted topic counts and heartbeats are written to. It must exist.
	// Default "counts".
	CountsTopic string
	// LocalTopic is this data center's own hits topic; every other hits topic consumed is
	// another data center's, replicated here. Records of LocalTopic are held back by the
	// difference between the replicated records' lag and the local ones' (at most
	// MaxLocalHold), so that the counts show every site as of about the same moment (see
	// hold.go). Default Topics[0], or "hits" (topics.DefaultHitsTopic) with TopicPattern.
	LocalTopic string
	// MaxLocalHold bounds how long local records are held back. Default
	// DefaultMaxLocalHold; negative: never held.
	MaxLocalHold time.Duration
	// DeadLetterTopic, when set, receives a copy of every skipped hit record with a
	// HeaderReason header. Default "" (no copies).
	DeadLetterTopic string
	// CountsFormat is how count records are written: "binary" (the compact versioned
	// format) or "json" (the JSON form, which kcat, ksqlDB, Kafka Connect or any JSON
	// reader can read without a decoder; about three times larger). Enforcers read both.
	// Heartbeats stay binary. Default "binary".
	CountsFormat string
	// SubBuckets is the number of sub-window buckets per window. Default
	// window.DefaultSubBuckets; enforcers refuse counts made with another number.
	SubBuckets int
	// SiteForget is how long after the last site record of a site (on a partition) the
	// aggregator forgets it. Until then a silent site's heartbeat time stays in this
	// aggregator's heartbeats, ever older, so that enforcers keep reserving its share of
	// the keys it served (a site cut off from here is also counted as of its last
	// heartbeat), and a site that left stays listed as left; after it, the site is taken
	// for gone. A partition between data centers that lasts longer than SiteForget is no
	// longer bounded. Default DefaultSiteForget.
	SiteForget time.Duration
	// EmitInterval is the least time between two counts published for one counter, and the
	// period of the emission loop. Default DefaultEmitInterval.
	EmitInterval time.Duration
	// MaxEmitPerSecond caps published count records (tombstones included); when more are
	// due, the counters whose value changed most go first and the rest wait. Default
	// DefaultMaxEmitPerSecond.
	MaxEmitPerSecond int
	// HeartbeatInterval is the period of heartbeat records. Default DefaultHeartbeatInterval.
	HeartbeatInterval time.Duration
	// Lateness is how late (by bucket start) a hit may arrive and still be counted, and how
	// much earlier than the longest window recovery starts replaying. Default DefaultLateness.
	Lateness time.Duration
	// MaxClockSkew is how far ahead of the aggregator's clock (and of the record's own
	// timestamp) a hit's bucket start may be. Default DefaultMaxClockSkew.
	MaxClockSkew time.Duration
	// MaxKeys bounds the counters held (and, separately, the re-routed hits remembered for
	// de-duplication). A new counter beyond it takes the place of the least recently hit
	// of a sample (evicted_keys_total); a re-routed hit beyond the dedupe bound is dropped
	// (refused_keys_total). Default DefaultMaxKeys.
	MaxKeys int
	// DefaultWindow is the window of JSON hits without "w". Default DefaultDefaultWindow.
	DefaultWindow time.Duration
	// MaxWindow is the longest window accepted; recovery replays MaxWindow + Lateness of
	// hits. Longer windows are skipped as "window_too_long". Default topics.DefaultMaxWindow.
	MaxWindow time.Duration
	// Clock tells time. Default clock.Real{}.
	Clock clock.Clock
	// Logger receives the aggregator's logs. Default slog.Default().
	Logger *slog.Logger
	// Registerer receives the metrics (namespace streamlimit, subsystem aggregator).
	// Nil: metrics are kept but not registered.
	Registerer prometheus.Registerer
	// KafkaOpts are added after the aggregator's own client options (TLS, SASL, client id;
	// see internal/kafkaopt). They must not change the group balancer.
	KafkaOpts []kgo.Opt
	// MetadataMaxAge bounds how long a hits topic that appears after the aggregator started
	// (a new data center's "<dc>.hits", created by MirrorMaker 2) goes unconsumed when
	// consuming by pattern. Default DefaultMetadataMaxAge (franz-go's own default is 5m).
	MetadataMaxAge time.Duration
	// SiteKeys, when set, turns site authentication on: a hits-topic record is counted
	// only if its topics.HeaderSiteMAC header proves the site it names, under that site's
	// key here; others are skipped and counted by reason ("unsigned", "bad_signature",
	// "unknown_site") and logged at most once a second per reason. Every site, local or
	// replicated, needs its key. Default nil: records are taken at their word.
	SiteKeys *topics.SiteKeys
	// InstanceID names this instance in heartbeats and, when set, is its static group
	// membership (Kafka's group.instance.id): a restart with the same InstanceID within
	// SessionTimeout is given the same slots back without a rebalance (it replays them,
	// while the other members go on undisturbed). It must be stable across restarts (a pod
	// name, a host name) and unique among running aggregators: the group fences the older
	// of two members that share one. Default "<hostname>-<pid>-<random>", with dynamic
	// membership (every start is a new member).
	InstanceID string
}

func (c Config) normalize() (Config, error) {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	if c.Group == "" {
		c.Group = DefaultGroup
	}
	if len(c.Topics) == 0 && c.TopicPattern == "" {
		c.TopicPattern = topics.HitsPattern(topics.DefaultHitsTopic)
	}
	if c.CountsTopic == "" {
		c.CountsTopic = topics.DefaultCountsTopic
	}
	switch c.CountsFormat {
	case "":
		c.CountsFormat = CountsBinary
	case CountsBinary, CountsJSON:
	default:
		return c, fmt.Errorf("aggregator: CountsFormat %q: want %q or %q", c.CountsFormat, CountsBinary, CountsJSON)
	}
	if c.LocalTopic == "" {
		c.LocalTopic = topics.DefaultHitsTopic
		if len(c.Topics) > 0 {
			c.LocalTopic = c.Topics[0]
		}
	}
	if c.MaxLocalHold == 0 {
		c.MaxLocalHold = DefaultMaxLocalHold
	}
	if c.SubBuckets == 0 {
		c.SubBuckets = window.DefaultSubBuckets
	}
	if c.MaxEmitPerSecond == 0 {
		c.MaxEmitPerSecond = DefaultMaxEmitPerSecond
	}
	if c.MaxKeys == 0 {
		c.MaxKeys = DefaultMaxKeys
	}
	def(&c.EmitInterval, DefaultEmitInterval)
	def(&c.HeartbeatInterval, DefaultHeartbeatInterval)
	def(&c.Lateness, DefaultLateness)
	def(&c.MaxClockSkew, DefaultMaxClockSkew)
	def(&c.DefaultWindow, DefaultDefaultWindow)
	def(&c.MaxWindow, topics.DefaultMaxWindow)
	def(&c.MetadataMaxAge, DefaultMetadataMaxAge)
	def(&c.SiteForget, DefaultSiteForget)
	def(&c.SessionTimeout, DefaultSessionTimeout)
	c.Clock = clock.Or(c.Clock)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.InstanceID == "" {
		host, _ := os.Hostname()
		var b [4]byte
		_, _ = rand.Read(b[:])
		c.InstanceID = fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
	}
	var errs []error
	if len(c.Brokers) == 0 && len(c.KafkaOpts) == 0 {
		errs = append(errs, errors.New("aggregator: no brokers"))
	}
	if c.TopicPattern != "" && len(c.Topics) == 0 {
		if _, err := regexp.Compile(c.TopicPattern); err != nil {
			errs = append(errs, fmt.Errorf("aggregator: topic pattern: %w", err))
		}
	}
	if c.SubBuckets < 1 || c.MaxEmitPerSecond < 1 || c.MaxKeys < 1 {
		errs = append(errs, fmt.Errorf("aggregator: SubBuckets %d, MaxEmitPerSecond %d and MaxKeys %d must be positive",
			c.SubBuckets, c.MaxEmitPerSecond, c.MaxKeys))
	}
	for name, d := range map[string]time.Duration{"EmitInterval": c.EmitInterval, "HeartbeatInterval": c.HeartbeatInterval,
		"Lateness": c.Lateness, "MaxClockSkew": c.MaxClockSkew, "DefaultWindow": c.DefaultWindow, "MaxWindow": c.MaxWindow,
		"SiteForget": c.SiteForget, "SessionTimeout": c.SessionTimeout} {
		if d < time.Millisecond {
			errs = append(errs, fmt.Errorf("aggregator: %s %v must be at least 1ms", name, d))
		}
	}
	if c.DefaultWindow > c.MaxWindow {
		errs = append(errs, fmt.Errorf("aggregator: DefaultWindow %v exceeds MaxWindow %v", c.DefaultWindow, c.MaxWindow))
	}
	return c, errors.Join(errs...)
}

// appendCount encodes c in CountsFormat.
func (c *Config) appendCount(dst []byte, cnt *topics.Count) ([]byte, error) {
	if c.CountsFormat == CountsJSON {
		return cnt.AppendJSON(dst)
	}
	return cnt.AppendBinary(dst)
}

// The values of Config.CountsFormat.
const (
	CountsBinary = "binary"
	CountsJSON   = "json"
)

// remote reports whether a hits topic is another data center's, replicated here: every
// topic but LocalTopic.
func (c *Config) remote(topic string) bool { return topic != c.LocalTopic }

// checkSiteHeartbeat returns the bad_records_total reason for which a site record (a
// heartbeat or a leave) of time ts must be skipped at now (ms), or "": dated no more than
// topics.MaxSiteRecordAhead ahead (or MaxClockSkew, if smaller), and no older than
// SiteForget. Hits may be stamped up to MaxClockSkew ahead, as their buckets say when
// they were counted; a site record's time says until when its site is heard from, or
// since when it is gone, and one dated further ahead than clocks disagree would override
// what the site itself says until then.
func (c *Config) checkSiteHeartbeat(now, ts int64, recordTime time.Time) string {
	skew := min(c.MaxClockSkew, topics.MaxSiteRecordAhead).Milliseconds()
	switch {
	case ts > now+skew || (!recordTime.IsZero() && ts > recordTime.UnixMilli()+skew):
		return ReasonTooFarFuture
	case ts+c.SiteForget.Milliseconds() < now:
		return ReasonTooOld
	}
	return ""
}

// checkHit defaults h's window and returns the bad_records_total reason for which the hit
// must be skipped at aggregator time now (ms), or "" to count it. recordTime is the Kafka
// record's timestamp (zero when unknown), which also bounds how far ahead the bucket start
// may be. Both the Kafka path and Memory use it, so they accept exactly the same hits.
func (c *Config) checkHit(now int64, h *hitRef, recordTime time.Time) string {
	if h.window == 0 {
		h.window = c.DefaultWindow.Milliseconds()
	}
	skew, late := c.MaxClockSkew.Milliseconds(), c.Lateness.Milliseconds()
	switch {
	case h.window > c.MaxWindow.Milliseconds():
		return ReasonWindowTooLong
	case h.bucketStart > now+skew || (!recordTime.IsZero() && h.bucketStart > recordTime.UnixMilli()+skew):
		return ReasonTooFarFuture
	case h.bucketStart+h.window+late < now:
		return ReasonTooOld
	}
	return ""
}

// stateConfig is the part of c that the counter state needs.
func (c *Config) stateConfig() stateConfig {
	return stateConfig{
		subBuckets:   c.SubBuckets,
		tau:          topics.DemandTimeConstant.Milliseconds(),
		siteForget:   c.SiteForget.Milliseconds(),
		maxSkew:      c.MaxClockSkew,
		maxKeys:      c.MaxKeys,
		emitInterval: c.EmitInterval.Milliseconds(),
		maxSpecs:     1024,
	}
}

// emitBudget is how many records one emission round may publish:
// MaxEmitPerSecond × EmitInterval, at least 1.
func (c *Config) emitBudget() int {
	return max(1, int(int64(c.MaxEmitPerSecond)*int64(c.EmitInterval)/int64(time.Second)))
}
