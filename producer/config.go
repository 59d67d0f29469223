package producer

import (
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamlimit/streamlimit/clock"
	"github.com/streamlimit/streamlimit/topics"
	"github.com/streamlimit/streamlimit/window"
)

// Defaults for the zero fields of Config.
const (
	DefaultBucketWidth   = 100 * time.Millisecond
	DefaultFlushInterval = 10 * time.Millisecond
	// DefaultFlushSpread is none: buckets that end together leave together, in one Kafka
	// request (see Config.FlushSpread).
	DefaultFlushSpread        = time.Duration(0)
	DefaultMaxBufferedKeys    = 100_000
	DefaultMaxInFlightRecords = 10_000
	DefaultIdleTimeout        = time.Minute
	// DefaultSiteHeartbeatInterval is Config.SiteHeartbeatInterval when zero.
	DefaultSiteHeartbeatInterval = 500 * time.Millisecond
)

// ErrBadConfig is wrapped by every configuration error New returns.
var ErrBadConfig = errors.New("invalid producer config")

// Config configures a Producer. Only Site and one of Brokers or Client are required; every
// other zero field takes the default written in its comment.
type Config struct {
	// Brokers are the Kafka bootstrap addresses (host:port). The Producer creates its own
	// client from them (plus KafkaOpts) and closes it in Close. Exactly one of Brokers and
	// Client must be set.
	Brokers []string
	// Client is an existing franz-go client to produce with. The Producer never closes it,
	// and it is used as configured: for the Java-compatible key placement the Producer
	// promises, its partitioner must hash keys with murmur2 — kgo's default partitioner and
	// kgo.StickyKeyPartitioner(nil) both do; kgo.ManualPartitioner or a custom hasher
	// do not. Its own kgo.MaxBufferedRecords bounds the records in flight.
	Client *kgo.Client
	// KafkaOpts are extra options for the client built from Brokers (TLS, SASL, client
	// id; see internal/kafkaopt). They are applied after the Producer's own options
	// (seed brokers, Java-compatible partitioner, MaxBufferedRecords), so they can
	// override them. Ignored when Client is set.
	KafkaOpts []kgo.Opt
	// Topic is the hits topic. Default topics.DefaultHitsTopic ("hits").
	Topic string
	// Site names the unit that shares an exact counter: one process, or one
	// data center's Redis. It is written into every record. Required, 1..topics.MaxSiteLen
	// bytes.
	Site string
	// BucketWidth is the width of the time buckets hits are grouped into. Bucket starts are
	// multiples of BucketWidth since the Unix epoch on the Producer's clock. It must be a
	// whole number of milliseconds. Default DefaultBucketWidth (100 ms).
	BucketWidth time.Duration
	// SiteKey, when set, is this site's key (topics.SiteKeys, at least
	// topics.MinSiteKeyLen bytes): every record the Producer writes (hits, hit batches,
	// site heartbeats and leaves) carries topics.HeaderSiteMAC, its proof of Site, which
	// aggregators given the site keys require. Default nil: records are not signed.
	SiteKey []byte
	// Instance names this producer in its site heartbeats. Default
	// "<hostname>-<pid>-<random>".
	Instance string
	// Counter says, in the site heartbeats, what holds this site's exact count:
	// "process:<instance>" when the site is this process, "redis:<address>" for a data
	// center's Redis shared by its enforcers. The aggregators report a site announced by
	// instances that count apart, at least one in its own process: two processes that were
	// given one --site but no shared Redis each admit the site's whole share. Default ""
	// (not stated: nothing is checked).
	Counter string
	// SubBuckets is the number of sub-window buckets the aggregators split windows into.
	// Buckets are cut at the sub-bucket boundaries of each hit's window so that a record
	// never straddles two sub-buckets. Default window.DefaultSubBuckets.
	SubBuckets int
	// SiteHeartbeatInterval is the period of the site heartbeats (topics.SiteHeartbeatKey)
	// the background flush writes to every partition of Topic, by which every data center's
	// aggregators and enforcers know that this site is alive and how recent their view of it
	// is. Negative: none (then other data centers cannot tell this site's silence from a
	// cut link). Heartbeats need the Producer's own client (Brokers): with Client set none
	// are sent. Default DefaultSiteHeartbeatInterval (500 ms).
	SiteHeartbeatInterval time.Duration
	// FlushInterval is the period of the background flush, which hands every finished
	// bucket to Kafka. Its ticks fall just after multiples of FlushInterval, so with a
	// FlushInterval that divides BucketWidth a bucket leaves at its end plus its shard's
	// part of FlushSpread. Default DefaultFlushInterval (a tick costs a pass over the
	// counters holding hits, microseconds). A negative value disables the background
	// flush: hits then leave only through Flush and Close (for tests and simulations
	// driven by a fake clock).
	FlushInterval time.Duration
	// FlushSpread spreads the hand-off of buckets that end together (every counter's
	// buckets end at the same multiples of BucketWidth) over this long after their end,
	// by shard of the key. It was 20 ms while every count was a Kafka record of its own,
	// so that a busy server's core did not encode and acknowledge thousands of records in
	// one burst; with counts in hit batches a flush costs little per count, and a spread
	// only splits a bucket's counts over more Kafka requests (each costs the broker about
	// half a millisecond of CPU) and adds FlushSpread/2 to the mean delay of a hit.
	// Zero means DefaultFlushSpread (none); negative means none too.
	FlushSpread time.Duration
	// MaxBufferedKeys bounds the counters the Producer holds (known (key, window) pairs)
	// plus the counts Kafka could not take yet. When it is full, a new counter takes the
	// place of an idle one — nothing pending, not hit in its last two buckets if possible,
	// the least hit first — so that a flood of new keys evicts its own keys, never the
	// hits of keys that carry traffic; only when every held counter has hits not yet
	// handed to Kafka is the new counter's hit dropped (dropped_hits_total{reason="no_room"}).
	// Finished buckets waiting for the next flush are not held against it (an entry parks
	// at most one per bucket boundary between two flushes), so a held counter's hits are
	// never dropped for room. Default DefaultMaxBufferedKeys (100 000).
	MaxBufferedKeys int
	// MaxInFlightRecords bounds the records handed to the Kafka client and not yet
	// acknowledged (kgo.MaxBufferedRecords of the client built from Brokers). When it is
	// reached, further counts stay merged in the Producer's buffer. Default
	// DefaultMaxInFlightRecords (10 000). With Client set, that client's own
	// MaxBufferedRecords applies instead.
	MaxInFlightRecords int
	// IdleTimeout is how long a counter with no hits stays known (keeping later hits on it
	// allocation-free) before it is evicted; idle counters also make room for new ones
	// when MaxBufferedKeys is reached. Default DefaultIdleTimeout (1 min).
	IdleTimeout time.Duration
	// SingleHitRecords makes every count a hit record of its own, as producers before hit
	// batches wrote them, instead of sending the counts of one partition together in hit
	// batch records (topics.HitBatchKey), which cost Kafka one record per batch rather
	// than per count. Set it while aggregators older than the hit batch format still read
	// the hits topics (they skip a batch as an unknown version): upgrade the aggregators
	// first. Default false.
	SingleHitRecords bool
	// Clock gives the time of Hit and the age of counters. Default clock.Real{}.
	Clock clock.Clock
	// Logger receives produce failures (rate-limited) and lifecycle messages. Default
	// slog.Default().
	Logger *slog.Logger
	// Registerer receives the Producer's metrics (namespace "streamlimit", subsystem
	// "producer"). Nil means no registration; Stats still reports the same numbers.
	// Registering two Producers on one Registerer fails with a duplicate-metric error.
	Registerer prometheus.Registerer
}

func (c Config) withDefaults() (Config, error) {
	switch {
	case c.Client == nil && len(c.Brokers) == 0:
		return c, fmt.Errorf("%w: set Brokers or Client", ErrBadConfig)
	case c.Client != nil && len(c.Brokers) != 0:
		return c, fmt.Errorf("%w: set only one of Brokers and Client", ErrBadConfig)
	}
	if c.Site == "" || len(c.Site) > topics.MaxSiteLen || !utf8.ValidString(c.Site) {
		return c, fmt.Errorf("%w: Site must be 1..%d bytes of UTF-8, got %q", ErrBadConfig, topics.MaxSiteLen, c.Site)
	}
	if c.Topic == "" {
		c.Topic = topics.DefaultHitsTopic
	}
	if c.BucketWidth == 0 {
		c.BucketWidth = DefaultBucketWidth
	}
	if c.BucketWidth < time.Millisecond || c.BucketWidth%time.Millisecond != 0 {
		return c, fmt.Errorf("%w: BucketWidth %v is not a positive whole number of milliseconds", ErrBadConfig, c.BucketWidth)
	}
	if c.FlushInterval == 0 {
		c.FlushInterval = DefaultFlushInterval
	}
	switch {
	case c.FlushSpread == 0:
		c.FlushSpread = DefaultFlushSpread
	case c.FlushSpread < 0:
		c.FlushSpread = 0
	}
	if c.SubBuckets == 0 {
		c.SubBuckets = window.DefaultSubBuckets
	}
	if c.SubBuckets < 0 {
		return c, fmt.Errorf("%w: SubBuckets %d < 0", ErrBadConfig, c.SubBuckets)
	}
	if c.SiteHeartbeatInterval == 0 {
		c.SiteHeartbeatInterval = DefaultSiteHeartbeatInterval
	}
	if c.Instance == "" {
		host, _ := os.Hostname()
		var b [4]byte
		_, _ = rand.Read(b[:])
		c.Instance = fmt.Sprintf("%s-%d-%x", host, os.Getpid(), b)
	}
	if len(c.Instance) > topics.MaxSiteLen || len(c.Counter) > topics.MaxSiteLen || !utf8.ValidString(c.Instance) || !utf8.ValidString(c.Counter) {
		return c, fmt.Errorf("%w: Instance and Counter must be at most %d bytes of UTF-8", ErrBadConfig, topics.MaxSiteLen)
	}
	if c.SiteKey != nil && len(c.SiteKey) < topics.MinSiteKeyLen {
		return c, fmt.Errorf("%w: SiteKey of %d bytes, at least %d", ErrBadConfig, len(c.SiteKey), topics.MinSiteKeyLen)
	}
	if c.MaxBufferedKeys == 0 {
		c.MaxBufferedKeys = DefaultMaxBufferedKeys
	}
	if c.MaxBufferedKeys < 0 {
		return c, fmt.Errorf("%w: MaxBufferedKeys %d < 0", ErrBadConfig, c.MaxBufferedKeys)
	}
	if c.MaxInFlightRecords == 0 {
		c.MaxInFlightRecords = DefaultMaxInFlightRecords
	}
	if c.MaxInFlightRecords < 0 {
		return c, fmt.Errorf("%w: MaxInFlightRecords %d < 0", ErrBadConfig, c.MaxInFlightRecords)
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
	if c.IdleTimeout < 0 {
		return c, fmt.Errorf("%w: IdleTimeout %v < 0", ErrBadConfig, c.IdleTimeout)
	}
	c.Clock = clock.Or(c.Clock)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c, nil
}
