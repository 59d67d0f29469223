package aggregator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamlimit/streamlimit/topics"
)

// Header names the aggregator puts on records it copies.
const (
	// HeaderReason names why a hit was copied to the dead-letter topic (a bad_records_total
	// reason).
	HeaderReason = "streamlimit-reason"
)

// Aggregator consumes hits and publishes sliding-window counts; see the package
// documentation. Create it with New and run it with Run; Ready and Keys may be called from
// any goroutine at any time.
type Aggregator struct {
	cfg Config
	log *slog.Logger
	// counting's state, hold and scratch are guarded by mu.
	counting
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
	// hbNow asks the publishing loop for a heartbeat round now (a replay ended), without waiting for
	// its ticker.
	hbNow chan struct{}

	mu          sync.Mutex
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
	// authLog is, per reason, when records refused by site authentication were last
	// logged (authFailed), guarded by mu.
	authLog map[string]*authLogState
	// batchHits is process's scratch, guarded by mu: the hits of a hit batch, read whole
	// (and checked) in one pass before any is counted.
	batchHits []topics.BatchHit
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
		counting:   newCounting(&cfg, m),
		static:     static,
		hbNow:      make(chan struct{}, 1),
		parts:      map[tp]*partState{},
		nparts:     map[string]int32{},
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
	wg.Go(func() { a.publishLoop(loopCtx, cl) })
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
