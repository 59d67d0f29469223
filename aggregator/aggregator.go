package aggregator

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamlimit/streamlimit/internal/clock"
	"github.com/streamlimit/streamlimit/topics"
	"github.com/streamlimit/streamlimit/window"
)

// Header names the aggregator puts on records it copies.
const (
	// HeaderReason names why a hit was copied to the dead-letter topic (a bad_records_total
	// reason).
	HeaderReason = "streamlimit-reason"
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
	// DefaultDemandTimeConstant is the time constant of the sites' demand.
	DefaultDemandTimeConstant = time.Second
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
	// partition count (see the package documentation).
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
	// DemandTimeConstant is τ of the sites' demand (topics.SiteCount.Demand): a request
	// weighs e^(−age/τ). It sets how fast the sites' shares of a hot key's room follow a
	// client that moves between data centers. Default DefaultDemandTimeConstant.
	DemandTimeConstant time.Duration
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
	// de-duplication). Hits for new counters beyond it are dropped and counted in
	// refused_keys_total. Default DefaultMaxKeys.
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
	def(&c.DemandTimeConstant, DefaultDemandTimeConstant)
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
		"DemandTimeConstant": c.DemandTimeConstant, "SiteForget": c.SiteForget, "SessionTimeout": c.SessionTimeout} {
		if d < time.Millisecond {
			errs = append(errs, fmt.Errorf("aggregator: %s %v must be at least 1ms", name, d))
		}
	}
	if c.DefaultWindow > c.MaxWindow {
		errs = append(errs, fmt.Errorf("aggregator: DefaultWindow %v exceeds MaxWindow %v", c.DefaultWindow, c.MaxWindow))
	}
	return c, errors.Join(errs...)
}

// Aggregator consumes hits and publishes sliding-window counts; see the package
// documentation. Create it with New and run it with Run; Ready and Keys may be called from
// any goroutine at any time.
type Aggregator struct {
	cfg Config
	log *slog.Logger
	m   *metrics
	// instHeader names this instance on every record it writes to the counts topic
	// (topics.InstanceHeader); shared, read only, by those records.
	instHeader []kgo.RecordHeader

	admin *kadm.Client // on the group client; set by onAssigned, which precedes adjust
	// static says that InstanceID was given: it is the group instance id.
	static bool
	// started is when New made the Aggregator (unix ms), newestCount when Kafka
	// acknowledged the newest count it published (unix ms, 0: none yet):
	// newest_count_age_seconds.
	started, newestCount atomic.Int64
	// pubMu orders publication against handing slots over: an emission or heartbeat round
	// holds it for reading from choosing its records until they are handed to the client,
	// and a revocation takes it for writing once the revoked slots are dropped, so that
	// every record of those slots is in the client (then flushed) before the group can give
	// them to another member.
	pubMu sync.RWMutex
	// hbNow asks the heartbeat loop for a round now (a replay ended), without waiting for
	// its ticker.
	hbNow chan struct{}

	mu          sync.Mutex
	st          *state
	parts       map[tp]*partState
	nparts      map[string]int32 // partition count of each hits topic
	countsParts int32
	joined      bool
	running     bool
	stopping    bool // Run is leaving the group: nothing more is published
	// replayingParts is how many partitions replay; replayFrom is when the current batch
	// of replays began (the count went from 0 to more) and replayRecords how many records it
	// has to replay: one log line when a batch starts and one when it is done.
	replayingParts  int
	replayFrom      time.Time
	replayRecords   int64
	sessionErrs     int   // group session failures since the last assignment
	lastConflictLog int64 // ms of the last site-conflict log, guarded by mu
	// hold keeps local records back (see hold.go); heldBuf is release's scratch. Both
	// guarded by mu.
	hold    holder
	heldBuf []held
}

// tp names one partition of a hits topic: the local "hits" or a data center's replicated
// "<dc>.hits". The sites heard on one topic are one data center's, so a site silent while
// the others of its topic still speak has stopped on its own (a crash), while a topic whose
// sites are all silent has been cut off (sites.go).
type tp struct {
	topic string
	part  int32
}

type partState struct {
	next, hwm, target int64
	replaying         bool
	fresh             bool // assigned but not yet positioned
	assignedAt        time.Time
	replayedAt        time.Time
}

// New validates cfg and returns an Aggregator. It registers the metrics on cfg.Registerer
// and touches no network.
func New(cfg Config) (*Aggregator, error) {
	static := cfg.InstanceID != ""
	cfg, err := cfg.normalize()
	if err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	a := &Aggregator{
		cfg:        cfg,
		instHeader: []kgo.RecordHeader{{Key: topics.InstanceHeader, Value: []byte(cfg.InstanceID)}},
		log:        cfg.Logger.With("component", "aggregator", "instance", cfg.InstanceID),
		m:          m,
		static:     static,
		hbNow:      make(chan struct{}, 1),
		st:         newState(cfg.stateConfig()),
		parts:      map[tp]*partState{},
		nparts:     map[string]int32{},
		hold:       holder{max: max(cfg.MaxLocalHold.Milliseconds(), 0)},
	}
	a.started.Store(cfg.Clock.Now().UnixMilli())
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(newestCountAgeGauge(a.newestCountAge)); err != nil {
			return nil, fmt.Errorf("aggregator: register metrics: %w", err)
		}
	}
	return a, nil
}

// newestCountAge returns the seconds since the newest count this instance published was
// acknowledged, or since it started when none was.
func (a *Aggregator) newestCountAge() float64 {
	last := a.newestCount.Load()
	if last == 0 {
		last = a.started.Load()
	}
	return float64(a.cfg.Clock.Now().UnixMilli()-last) / 1000
}

// Ready reports whether the aggregator has joined its group and no assigned partition is
// replaying, i.e. whether every counter it owns is being published from complete state.
// It is what a /readyz handler should report.
func (a *Aggregator) Ready() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.running || !a.joined {
		return false
	}
	for _, ps := range a.parts {
		if ps.replaying || ps.fresh {
			return false
		}
	}
	return true
}

// Keys returns the number of counters held.
func (a *Aggregator) Keys() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.st.size()
}

// Assigned returns the hits partitions currently assigned, by topic.
func (a *Aggregator) Assigned() map[string][]int32 {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := map[string][]int32{}
	for k := range a.parts {
		out[k.topic] = append(out[k.topic], k.part)
	}
	return out
}

// Run consumes and publishes until ctx is done, then leaves the group at once (see leave)
// and returns nil; it returns an error if the Kafka client cannot be created or the counts
// topic is missing. Run may be called once.
func (a *Aggregator) Run(ctx context.Context) error {
	a.mu.Lock()
	if a.running {
		a.mu.Unlock()
		return errors.New("aggregator: Run called twice")
	}
	a.running = true
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		a.running = false
		a.mu.Unlock()
	}()

	opts := []kgo.Opt{
		kgo.ConsumerGroup(a.cfg.Group),
		// Partition s of every co-partitioned hits topic to one member (one key, one
		// owner), moving only what changes hands (balancer.go).
		kgo.Balancers(&slotBalancer{log: a.log}),
		kgo.SessionTimeout(a.cfg.SessionTimeout),
		kgo.HeartbeatInterval(groupHeartbeat(a.cfg.SessionTimeout)),
		kgo.WithHooks(&joinWatch{a: a, after: joinWaitAfter(a.cfg.SessionTimeout)}),
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		kgo.OnPartitionsAssigned(a.onAssigned),
		kgo.OnPartitionsRevoked(a.onRevoked),
		kgo.OnPartitionsLost(a.onLost),
		kgo.AdjustFetchOffsetsFn(a.adjust),
		kgo.RecordPartitioner(partitioner()),
		kgo.ProducerLinger(5 * time.Millisecond),
		kgo.FetchMaxWait(200 * time.Millisecond),
		kgo.ClientID("streamlimit-aggregator"),
		kgo.MetadataMaxAge(a.cfg.MetadataMaxAge),
		kgo.MetadataMinAge(min(a.cfg.MetadataMaxAge, 5*time.Second)),
	}
	if a.static {
		opts = append(opts, kgo.InstanceID(a.cfg.InstanceID))
	}
	if len(a.cfg.Brokers) > 0 {
		opts = append(opts, kgo.SeedBrokers(a.cfg.Brokers...))
	}
	if len(a.cfg.Topics) > 0 {
		opts = append(opts, kgo.ConsumeTopics(a.cfg.Topics...))
	} else {
		opts = append(opts, kgo.ConsumeTopics(a.cfg.TopicPattern), kgo.ConsumeRegex())
	}
	opts = append(opts, a.cfg.KafkaOpts...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("aggregator: kafka client: %w", err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	td, err := adm.ListTopics(ctx, a.cfg.CountsTopic)
	if err == nil {
		err = td.Error()
	}
	if err != nil {
		return fmt.Errorf("aggregator: counts topic %q: %w", a.cfg.CountsTopic, err)
	}
	a.mu.Lock()
	a.countsParts = int32(len(td[a.cfg.CountsTopic].Partitions))
	a.mu.Unlock()

	loopCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { a.emitLoop(loopCtx, cl) })
	wg.Go(func() { a.heartbeatLoop(loopCtx, cl) })
	a.pollLoop(loopCtx, cl)
	stop()
	wg.Wait()
	a.leave(cl)
	return nil
}

func (a *Aggregator) pollLoop(ctx context.Context, cl *kgo.Client) {
	for {
		// At most 10 000 records a poll. Taking everything buffered instead (PollFetches)
		// lets the client fetch and decode the next fetch while this loop counts, but on
		// a busy two-core machine that cost more CPU than it saved in waiting: replays of
		// 1 M hits were slower with it (docs/benchmarks.md).
		fetches := cl.PollRecords(ctx, 10000)
		if ctx.Err() != nil || fetches.IsClientClosed() {
			cl.AllowRebalance()
			return
		}
		fetches.EachError(func(t string, p int32, err error) {
			var gs *kgo.ErrGroupSession
			switch {
			case errors.Is(err, context.Canceled):
			case errors.As(err, &gs):
				a.sessionError(err)
			default:
				a.log.Warn("fetch", "topic", t, "partition", p, "err", err)
			}
		})
		now := a.cfg.Clock.Now().UnixMilli()
		fetches.EachPartition(func(fp kgo.FetchTopicPartition) {
			for recs := fp.Records; len(recs) > 0; {
				n := min(len(recs), lockChunk)
				a.count(ctx, cl, now, &fp, recs[:n])
				recs = recs[n:]
			}
		})
		a.mu.Lock()
		a.release(a.cfg.Clock.Now().UnixMilli())
		a.m.keys.Set(float64(a.st.size()))
		a.mu.Unlock()
		cl.AllowRebalance()
	}
}

// lockChunk is how many records are counted under one hold of a.mu: few enough that
// emission and heartbeats wait a millisecond or two at most, many enough that taking the
// lock costs nothing per record.
const lockChunk = 4096

// count counts recs, part of fp. The caller holds no lock.
func (a *Aggregator) count(ctx context.Context, cl *kgo.Client, now int64, fp *kgo.FetchTopicPartition, recs []*kgo.Record) {
	a.mu.Lock()
	defer a.mu.Unlock()
	ps := a.parts[tp{fp.Topic, fp.Partition}]
	if ps == nil || ps.fresh {
		// Revoked or lost (whoever owns the partition next reads these records again), or
		// not positioned yet.
		return
	}
	nparts := a.nparts[fp.Topic]
	for _, r := range recs {
		a.process(ctx, cl, now, ps, nparts, r)
		ps.next = r.Offset + 1
	}
	a.m.recordsIn.Add(float64(len(recs)))
	if fp.HighWatermark > 0 {
		ps.hwm = fp.HighWatermark
	}
	a.m.lag.WithLabelValues(fp.Topic, strconv.Itoa(int(fp.Partition))).Set(float64(max(ps.hwm-ps.next, 0)))
	a.checkReplayDone(fp.Partition, ps)
}

// sessionError logs a failure of the group session (franz-go reports one per attempt to
// rejoin, every retry backoff while the brokers are unreachable): the first at Warn, the
// retries at Debug, until the next assignment logs the rejoin.
func (a *Aggregator) sessionError(err error) {
	a.mu.Lock()
	a.sessionErrs++
	n := a.sessionErrs
	a.mu.Unlock()
	if n == 1 {
		a.log.Warn("group session failed; retrying until the group is rejoined (further failures are logged at debug level)", "err", err)
		return
	}
	a.log.Debug("group session failed again", "attempt", n, "err", err)
}

// checkReplayDone ends a partition's replay once it consumed up to the high watermark seen
// at assignment and to the one its latest fetch saw: caught up, so that the first counts and
// heartbeat of the slot after the replay are as fresh as any (a heartbeat written at the
// assignment's high watermark would show every site as unheard for as long as the replay
// took). It resumes the slot when no other partition of the slot replays.
func (a *Aggregator) checkReplayDone(slot int32, ps *partState) {
	if !ps.replaying || ps.next < max(ps.target, ps.hwm) {
		return
	}
	ps.replaying = false
	ps.replayedAt = time.Now()
	a.m.replayDur.Observe(ps.replayedAt.Sub(ps.assignedAt).Seconds())
	a.replayDone(slot, ps)
	a.recomputePaused()
	if !a.st.paused[slot] {
		a.st.markDirty(slot)
	}
}

func (a *Aggregator) recomputePaused() {
	clear(a.st.paused)
	for k, ps := range a.parts {
		if ps.replaying || ps.fresh {
			a.st.paused[k.part] = true
		}
	}
}

// process handles one hit record. The caller holds a.mu.
// nparts is the partition count of the record's topic (0: unknown, no re-routing).
func (a *Aggregator) process(ctx context.Context, cl *kgo.Client, now int64, ps *partState, nparts int32, r *kgo.Record) {
	origin := ""
	for _, h := range r.Headers {
		if h.Key == topics.HeaderRerouted {
			origin = string(h.Value)
			if origin == "" {
				origin = "?"
			}
		}
	}
	var h hitRef
	if !decodeFast(r.Value, &h) {
		slow, err := topics.DecodeHit(r.Value)
		if err != nil {
			a.bad(ctx, cl, topics.Reason(err), r, err)
			return
		}
		if slow.IsSiteRecord() {
			a.siteRecord(ctx, cl, now, ps, r, slow)
			return
		}
		h = hitRef{key: []byte(slow.Key), site: []byte(slow.Site), bucketStart: slow.BucketStart, window: slow.Window, count: slow.Count, denied: slow.Denied}
	}
	if reason := a.cfg.checkHit(now, &h, r.Timestamp); reason != "" {
		if reason != ReasonTooOld || !ps.replaying { // during replay, old hits are expected, not bad
			a.bad(ctx, cl, reason, r, nil)
		}
		return
	}
	late := a.cfg.Lateness.Milliseconds()
	if origin == "" && nparts > 0 {
		// Ownership follows the counter key (the hit's key), which our producer also uses
		// as the record key.
		h.hash, h.hashed = murmur2(h.key), true
		if q := partitionOf(h.hash, nparts); q != r.Partition {
			a.reroute(ctx, cl, r, h.key, q)
			return
		}
	}
	it := held{slot: r.Partition, h: h, origin: origin, expiry: h.bucketStart + h.window + late}
	if !ps.replaying {
		remote := a.cfg.remote(r.Topic)
		a.hold.sample(now, h.bucketStart, remote)
		if !remote && a.hold.delay() > 0 {
			a.hold.push(now, it)
			return
		}
	}
	applyHeld(a.st, a.m, now, &it)
}

// siteRecord records that the site of a site heartbeat was heard from on the record's
// partition up to its time, or that an instance of it left (a leave record). Site records
// are not re-routed: producers write one to every partition.
func (a *Aggregator) siteRecord(ctx context.Context, cl *kgo.Client, now int64, ps *partState, r *kgo.Record, h topics.Hit) {
	if reason := a.cfg.checkSiteHeartbeat(now, h.BucketStart, r.Timestamp); reason != "" {
		if reason != ReasonTooOld || !ps.replaying {
			a.bad(ctx, cl, reason, r, nil)
		}
		return
	}
	remote := a.cfg.remote(r.Topic)
	if !ps.replaying {
		a.hold.sample(now, h.BucketStart, remote)
		if !remote && a.hold.delay() > 0 {
			a.hold.push(now, siteHeld(r.Topic, r.Partition, h))
			return
		}
	}
	it := siteHeld(r.Topic, r.Partition, h)
	applyHeld(a.st, a.m, now, &it)
}

// siteHeld is site record h of a topic's partition as a held record.
func siteHeld(topic string, part int32, h topics.Hit) held {
	return held{slot: part, site: true, leave: h.IsSiteLeave(), topic: topic, h: hitRef{site: []byte(h.Site), bucketStart: h.BucketStart}, inst: h.Instance, counter: h.Counter}
}

// release counts the held local records whose time has come at now. The caller holds a.mu.
func (a *Aggregator) release(now int64) {
	a.heldBuf = a.hold.due(now, a.heldBuf[:0])
	for i := range a.heldBuf {
		applyHeld(a.st, a.m, now, &a.heldBuf[i])
	}
	clear(a.heldBuf)
}

// applyHeld counts one held record, as the Kafka path and Memory do.
func applyHeld(st *state, m *metrics, now int64, it *held) {
	if it.site {
		src := tp{topic: it.topic, part: it.slot}
		if it.leave {
			m.siteLeaves.Inc()
			st.leftFrom(src, string(it.h.site), it.inst, it.h.bucketStart)
			return
		}
		m.siteHeartbeats.Inc()
		st.heardFrom(src, string(it.h.site), it.inst, it.h.bucketStart)
		st.sawInstance(now, string(it.h.site), it.inst, it.counter)
		return
	}
	switch st.addRaw(now, it.slot, it.h, it.origin, it.expiry) {
	case refusedKey:
		m.refused.Inc()
	case duplicate:
		m.duplicates.Inc()
	}
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

// reportConflicts sets the site_conflicts gauge and logs each conflicting site at error
// level, at most once a minute. The caller holds a.mu.
func (a *Aggregator) reportConflicts(now int64, sites []string) {
	a.m.siteConflicts.Set(float64(len(sites)))
	if len(sites) == 0 || now-a.lastConflictLog < 60_000 {
		return
	}
	a.lastConflictLog = now
	a.log.Error("several instances announce one site but count it apart (at least one in its own process): each admits the site's whole share; give each its own --site, or share the site's Redis",
		"sites", sites)
}

// checkSiteHeartbeat returns the bad_records_total reason for which a site heartbeat of
// time ts must be skipped at now (ms), or "": the same clock-skew bound as hits, and no
// older than SiteForget.
func (c *Config) checkSiteHeartbeat(now, ts int64, recordTime time.Time) string {
	skew := c.MaxClockSkew.Milliseconds()
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
		tau:          c.DemandTimeConstant.Milliseconds(),
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

// reroute re-publishes a misrouted hit to partition q (the key's murmur2 partition) of the
// same topic, marked with HeaderRerouted = "<topic>/<partition>/<offset>" of the original.
func (a *Aggregator) reroute(ctx context.Context, cl *kgo.Client, r *kgo.Record, key []byte, q int32) {
	a.m.rerouted.Inc()
	origin := r.Topic + "/" + strconv.Itoa(int(r.Partition)) + "/" + strconv.FormatInt(r.Offset, 10)
	hs := make([]kgo.RecordHeader, 0, len(r.Headers)+1)
	hs = append(hs, r.Headers...)
	hs = append(hs, kgo.RecordHeader{Key: topics.HeaderRerouted, Value: []byte(origin)})
	rec := &kgo.Record{Topic: r.Topic, Key: key, Value: r.Value, Timestamp: r.Timestamp, Headers: hs}
	cl.Produce(context.WithoutCancel(ctx), rec, func(_ *kgo.Record, err error) {
		if err != nil {
			a.log.Error("re-route misrouted hit", "origin", origin, "to_partition", q, "err", err)
		}
	})
}

func (a *Aggregator) bad(ctx context.Context, cl *kgo.Client, reason string, r *kgo.Record, err error) {
	a.m.bad.WithLabelValues(reason).Inc()
	a.log.Debug("bad hit record", "reason", reason, "topic", r.Topic, "partition", r.Partition, "offset", r.Offset, "err", err)
	if a.cfg.DeadLetterTopic == "" {
		return
	}
	hs := make([]kgo.RecordHeader, 0, len(r.Headers)+1)
	hs = append(hs, r.Headers...)
	hs = append(hs, kgo.RecordHeader{Key: HeaderReason, Value: []byte(reason)})
	rec := &kgo.Record{Topic: a.cfg.DeadLetterTopic, Key: r.Key, Value: r.Value, Timestamp: r.Timestamp, Headers: hs}
	cl.Produce(context.WithoutCancel(ctx), rec, func(_ *kgo.Record, err error) {
		if err != nil {
			a.log.Warn("dead-letter copy", "err", err)
		}
	})
}

func (a *Aggregator) emitLoop(ctx context.Context, cl *kgo.Client) {
	t := time.NewTicker(a.cfg.EmitInterval)
	defer t.Stop()
	var sc emitScratch
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		a.emitRound(ctx, cl, &sc)
	}
}

// emitScratch is an emission round's working memory, kept from round to round.
type emitScratch struct {
	cands []candidate
	outs  []emission
	buf   []byte
}

// emitRound publishes the counts that are due (see the package documentation), unless Run
// is leaving the group.
func (a *Aggregator) emitRound(ctx context.Context, cl *kgo.Client, sc *emitScratch) {
	a.pubMu.RLock()
	defer a.pubMu.RUnlock()
	start := time.Now()
	now := a.cfg.Clock.Now().UnixMilli()
	a.mu.Lock()
	if a.stopping {
		a.mu.Unlock()
		return
	}
	a.release(now)
	sc.cands, sc.outs = a.st.collect(now, a.cfg.emitBudget(), sc.cands, sc.outs[:0])
	a.m.keys.Set(float64(a.st.size()))
	a.mu.Unlock()
	for _, e := range sc.outs {
		rec := &kgo.Record{Topic: a.cfg.CountsTopic, Key: []byte(e.key), Headers: a.instHeader}
		if e.count != nil {
			var err error
			sc.buf, err = a.cfg.appendCount(sc.buf[:0], e.count)
			if err != nil {
				a.log.Error("encode count", "key", e.key, "err", err)
				continue
			}
			rec.Value = append([]byte(nil), sc.buf...)
		} else {
			a.m.tombstones.Inc()
		}
		a.m.countsOut.Inc()
		cl.Produce(ctx, rec, a.produced)
	}
	a.m.emitDur.Observe(time.Since(start).Seconds())
}

// produced is the delivery callback of every record the aggregator writes.
func (a *Aggregator) produced(r *kgo.Record, err error) {
	if err != nil {
		if !errors.Is(err, context.Canceled) {
			a.log.Error("publish", "topic", r.Topic, "key", string(r.Key), "err", err)
		}
		return
	}
	if r.Topic == a.cfg.CountsTopic && !topics.IsReservedKey(r.Key) {
		ms := r.Timestamp.UnixMilli()
		for last := a.newestCount.Load(); ms > last && !a.newestCount.CompareAndSwap(last, ms); last = a.newestCount.Load() {
		}
	}
}

func (a *Aggregator) heartbeatLoop(ctx context.Context, cl *kgo.Client) {
	t := time.NewTicker(a.cfg.HeartbeatInterval)
	defer t.Stop()
	var hbs []topics.Heartbeat
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-a.hbNow:
		}
		hbs = a.heartbeatRound(ctx, cl, hbs[:0])
	}
}

// heartbeatRound writes a heartbeat of every assigned partition that is positioned and not
// replaying to every partition of the counts topic, unless Run is leaving the group, and
// returns hbs for reuse. A partition that replays gets none: the latest heartbeat of a
// partition is then always from an owner whose counts of it are complete (the previous
// owner's while a new one replays), and says how fresh they are.
func (a *Aggregator) heartbeatRound(ctx context.Context, cl *kgo.Client, hbs []topics.Heartbeat) []topics.Heartbeat {
	a.pubMu.RLock()
	defer a.pubMu.RUnlock()
	now := a.cfg.Clock.Now().UnixMilli()
	a.mu.Lock()
	if a.stopping {
		a.mu.Unlock()
		return hbs
	}
	conflicts := a.st.conflicts(now)
	a.reportConflicts(now, conflicts)
	for k, ps := range a.parts {
		if ps.fresh || ps.replaying {
			continue
		}
		hb := topics.Heartbeat{Instance: a.cfg.InstanceID, Topic: k.topic, Partition: k.part,
			AsOf: now, Offset: ps.next, HighWatermark: ps.hwm, Conflicts: conflicts}
		hb.Sites, hb.Left = a.st.siteMaps(k, now)
		hbs = append(hbs, hb)
	}
	n := a.countsParts
	a.st.pruneSeen(now)
	a.mu.Unlock()
	for _, hb := range hbs {
		v, err := hb.MarshalBinary()
		if err != nil {
			a.log.Error("encode heartbeat", "err", err)
			continue
		}
		key := []byte(topics.HeartbeatKey(hb.Topic, hb.Partition))
		for p := range n {
			a.m.heartbeats.Inc()
			cl.Produce(ctx, &kgo.Record{Topic: a.cfg.CountsTopic, Key: key, Value: v, Partition: p, Headers: a.instHeader}, a.produced)
		}
	}
	return hbs
}
