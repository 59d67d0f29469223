package demo

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/sync/errgroup"

	"github.com/streamlimit/streamlimit/aggregator"
	"github.com/streamlimit/streamlimit/enforcer"
	"github.com/streamlimit/streamlimit/enforcer/rules"
	"github.com/streamlimit/streamlimit/enforcer/sitecount"
	"github.com/streamlimit/streamlimit/enforcer/snapshot"
	"github.com/streamlimit/streamlimit/producer"
	"github.com/streamlimit/streamlimit/topicadmin"
	"github.com/streamlimit/streamlimit/topics"
)

// RulesYAML is the demo's rules file, as embedded in the binary.
//
//go:embed rules.yaml
var RulesYAML string

// Domain is the rules domain of every demo request.
const Domain = "demo"

// MaxSites is the largest Options.Sites.
const MaxSites = 6

// Defaults of Options.
const (
	DefaultDuration     = 30 * time.Second
	DefaultSites        = 3
	DefaultReadyTimeout = 30 * time.Second
	// MaxDuration bounds Options.Duration: every decision is kept in memory until the
	// summary (16 bytes each, a few hundred per second).
	MaxDuration = time.Hour
)

// The pipeline's tuning. The limit's window is 5 s; these keep the pipeline lag (the time
// from an admission at one site to its appearance in the other sites' snapshots) a small
// fraction of it. Measured on a 2-core machine: see the package test.
const (
	hitsPartitions   = 6
	countsPartitions = 6
	// subBuckets splits the 5 s window into 100 ms buckets, the producer's bucket width,
	// so that each producer bucket is exactly one aggregator bucket and hits do not
	// expire early by up to a bucket. Aggregator and site counters must agree on it.
	subBuckets     = 50
	bucketWidth    = 100 * time.Millisecond
	flushInterval  = 50 * time.Millisecond
	emitInterval   = 100 * time.Millisecond
	heartbeatEvery = 500 * time.Millisecond
	maxStaleness   = 5 * time.Second
	// compactEvery is kfake's log.cleaner.backoff.ms: how often the embedded broker
	// compacts the counts topic (its default is an hour).
	compactEvery = 2 * time.Second
)

// Options configures Run. The zero value runs the default demo.
type Options struct {
	// Duration is how long the synthetic traffic runs. It must exceed the limit's window
	// (5 s) for any window to be measured, and be at most MaxDuration. Default
	// DefaultDuration (30 s).
	Duration time.Duration
	// Seed seeds the light clients' jitter; the same seed gives the same schedule (the
	// decisions still depend on real timing). Default 0, a valid seed.
	Seed uint64
	// Sites is the number of sites (enforcers), named eu, us, ap, sa, af, oc in that
	// order; 1..MaxSites. Default DefaultSites (3).
	Sites int
	// Live redraws a status table in place with ANSI escape sequences (for a terminal);
	// otherwise a plain status line is written every Every. Default false.
	Live bool
	// Every is the period of the status output. Default 500 ms when Live, else 2 s.
	Every time.Duration
	// ReadyTimeout bounds the wait for the embedded pipeline to be ready (aggregator
	// joined, every snapshot caught up and receiving heartbeats). Default
	// DefaultReadyTimeout (30 s).
	ReadyTimeout time.Duration
	// Logger receives the components' logs. Default: discard.
	Logger *slog.Logger
	// Network, when set, carries every connection to the embedded broker in memory
	// instead of over loopback sockets. With it the demo can run inside a
	// testing/synctest bubble, on virtual time, so that a test of its verdict does not
	// depend on how busy the machine is. Default nil: loopback.
	Network *kfake.VirtualNetwork
}

// kafkaOpts returns the client options every component of the demo uses to reach the
// embedded broker: the in-memory dialer of o.Network, if any.
func (o Options) kafkaOpts() []kgo.Opt {
	if o.Network == nil {
		return nil
	}
	return []kgo.Opt{kgo.Dialer(o.Network.DialContext)}
}

func (o Options) normalize() (Options, error) {
	if o.Duration == 0 {
		o.Duration = DefaultDuration
	}
	if o.Sites == 0 {
		o.Sites = DefaultSites
	}
	if o.Every == 0 {
		o.Every = 2 * time.Second
		if o.Live {
			o.Every = 500 * time.Millisecond
		}
	}
	if o.ReadyTimeout == 0 {
		o.ReadyTimeout = DefaultReadyTimeout
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	var errs []error
	if o.Duration < 0 || o.Duration > MaxDuration {
		errs = append(errs, fmt.Errorf("demo: duration %v is outside (0, %v]", o.Duration, MaxDuration))
	}
	if o.Sites < 1 || o.Sites > MaxSites {
		errs = append(errs, fmt.Errorf("demo: sites %d is outside 1..%d", o.Sites, MaxSites))
	}
	if o.Every < 0 || o.ReadyTimeout < 0 {
		errs = append(errs, errors.New("demo: Every and ReadyTimeout must not be negative"))
	}
	return o, errors.Join(errs...)
}

func siteName(i int) string { return [MaxSites]string{"eu", "us", "ap", "sa", "af", "oc"}[i] }

// site is one enforcer with its own snapshot, producer and exact counter.
type site struct {
	name    string
	snap    *snapshot.Snapshot
	prod    *producer.Producer
	counter *sitecount.Local
	lim     *enforcer.Engine
}

// LoadRules parses RulesYAML.
func LoadRules() (*rules.Config, error) {
	cfg, err := rules.Parse("demo.yaml", []byte(RulesYAML))
	if err != nil {
		return nil, fmt.Errorf("demo: embedded rules: %w", err)
	}
	return cfg, nil
}

// Run runs the demo: it starts the embedded pipeline, drives the synthetic clients for
// opts.Duration or until ctx is done, shuts everything down, writes the status output and
// then the summary to w, and returns the Summary.
//
// Each enforcer has its own snapshot of the counts topic, its own producer of hits and
// its own exact site counter, all sharing one global limit on the client descriptor
// (rules.yaml). The clients call enforcer.Engine.Decide directly, on the real clock:
// light clients, each well under the limit and always on its home site; one abusive
// client sending five times its limit, spread evenly over all sites, so that each site
// alone sees less than the limit and only a global count can stop it; one burst, at one
// site, of three times the limit within a second. Every decision is recorded with its
// time and site; the Summary sets the abusive client's exact maximum and mean over every
// sliding window against the limit and against what independent per-site limiters would
// have admitted (the limit times the number of sites).
//
// Cancelling ctx during the traffic ends it early: the summary covers what ran, with
// Interrupted set, and the error is nil. Cancelling ctx while the pipeline starts returns
// ctx's error. Other errors mean that the embedded pipeline could not start or failed.
// Whether the limit held is reported in the Summary, never as an error.
func Run(ctx context.Context, opts Options, w io.Writer) (Summary, error) {
	opts, err := opts.normalize()
	if err != nil {
		return Summary{}, err
	}
	rcfg, err := LoadRules()
	if err != nil {
		return Summary{}, err
	}
	plan, err := newPlan(rcfg, opts)
	if err != nil {
		return Summary{}, err
	}
	log := opts.Logger

	// The embedded broker, compacting the counts topic every compactEvery.
	kopts := []kfake.Opt{kfake.NumBrokers(1),
		kfake.BrokerConfigs(map[string]string{"log.cleaner.backoff.ms": fmt.Sprint(compactEvery.Milliseconds())})}
	if opts.Network != nil {
		kopts = append(kopts, kfake.ListenFn(opts.Network.Listen), kfake.Ports(9092))
	}
	cluster, err := kfake.NewCluster(kopts...)
	if err != nil {
		return Summary{}, fmt.Errorf("demo: embedded kafka: %w", err)
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()
	log.Info("embedded kafka started", "brokers", brokers)

	tcfg := topics.Config{
		HitsPartitions:         hitsPartitions,
		CountsPartitions:       countsPartitions,
		HitsRetention:          time.Hour,
		MaxWindow:              time.Minute,
		CountsSegment:          10 * time.Second,
		CountsDeleteRetention:  30 * time.Second,
		CountsMaxCompactionLag: 30 * time.Second,
	}
	if err := ensureTopics(ctx, brokers, opts.kafkaOpts(), tcfg); err != nil {
		return Summary{}, err
	}

	// Components run until stopPipe, not until ctx: on an interrupt the producers must
	// still deliver their last hits before the pipeline goes away.
	pipeCtx, stopPipe := context.WithCancel(context.WithoutCancel(ctx))
	defer stopPipe()
	g, gctx := errgroup.WithContext(pipeCtx)

	agg, err := aggregator.New(aggregator.Config{
		Brokers:           brokers,
		Topics:            []string{topics.DefaultHitsTopic},
		CountsTopic:       topics.DefaultCountsTopic,
		SubBuckets:        subBuckets,
		EmitInterval:      emitInterval,
		HeartbeatInterval: heartbeatEvery,
		MaxWindow:         time.Minute,
		InstanceID:        "demo-aggregator",
		KafkaOpts:         opts.kafkaOpts(),
		Logger:            log,
	})
	if err != nil {
		return Summary{}, fmt.Errorf("demo: %w", err)
	}
	g.Go(func() error { return agg.Run(gctx) })

	sites := make([]*site, opts.Sites)
	defer func() { // producers not closed on the normal path (errors during start)
		for _, s := range sites {
			if s != nil && s.prod != nil {
				cctx, cancel := context.WithTimeout(context.Background(), time.Second)
				_ = s.prod.Close(cctx)
				cancel()
			}
		}
	}()
	for i := range sites {
		s, err := newSite(siteName(i), brokers, rcfg, opts, log)
		if err != nil {
			return Summary{}, err
		}
		sites[i] = s
		g.Go(func() error { return s.snap.Run(gctx) })
	}

	if err := waitReady(ctx, gctx, opts.ReadyTimeout, agg, sites); err != nil {
		stopPipe()
		if gerr := g.Wait(); gerr != nil {
			err = gerr
		}
		return Summary{}, err
	}
	log.Info("pipeline ready; starting traffic")

	rec := newRecorder(plan, opts.Sites)
	trafficCtx, stopTraffic := context.WithTimeout(ctx, opts.Duration)
	defer stopTraffic()
	stopOnFailure := context.AfterFunc(gctx, stopTraffic)
	defer stopOnFailure()

	probe := &prober{sites: sites}
	mon := newMonitor(plan, rec, sites, probe, opts, w)
	var wg sync.WaitGroup
	rec.begin()
	wg.Go(func() { mon.run(trafficCtx) })
	wg.Go(func() { probe.run(trafficCtx, opts.Seed) })
	for i := range plan.clients {
		wg.Go(func() { plan.drive(trafficCtx, i, sites, rec) })
	}
	wg.Wait()
	elapsed := rec.elapsed()
	interrupted := ctx.Err() != nil

	// Shut down: deliver the last hits, then stop the pipeline.
	var shutdownErrs []error
	for _, s := range sites {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := s.prod.Close(cctx); err != nil {
			shutdownErrs = append(shutdownErrs, fmt.Errorf("producer %s: %w", s.name, err))
		}
		cancel()
		s.prod = nil
	}
	stopPipe()
	if err := g.Wait(); err != nil {
		return Summary{}, fmt.Errorf("demo: pipeline failed: %w", err)
	}
	for _, err := range shutdownErrs {
		log.Warn("demo shutdown", "err", err)
	}

	sum := summarize(plan, rec, elapsed, opts, probe.stats())
	sum.Interrupted = interrupted
	mon.finish()
	if err := sum.Write(w); err != nil {
		return sum, fmt.Errorf("demo: write summary: %w", err)
	}
	return sum, nil
}

func ensureTopics(ctx context.Context, brokers []string, kopts []kgo.Opt, cfg topics.Config) error {
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...)}, kopts...)...)
	if err != nil {
		return fmt.Errorf("demo: kafka client: %w", err)
	}
	defer cl.Close()
	if _, err := topicadmin.Ensure(ctx, kadm.NewClient(cl), cfg); err != nil {
		return fmt.Errorf("demo: create topics: %w", err)
	}
	return nil
}

func newSite(name string, brokers []string, rcfg *rules.Config, opts Options, log *slog.Logger) (*site, error) {
	log = log.With("site", name)
	snap, err := snapshot.New(snapshot.Config{
		Brokers:      brokers,
		Topic:        topics.DefaultCountsTopic,
		Site:         name,
		MaxStaleness: maxStaleness,
		SubBuckets:   subBuckets,
		KafkaOpts:    opts.kafkaOpts(),
		Logger:       log,
	})
	if err != nil {
		return nil, fmt.Errorf("demo: site %s: %w", name, err)
	}
	prod, err := producer.New(producer.Config{
		Brokers:       brokers,
		Topic:         topics.DefaultHitsTopic,
		Site:          name,
		BucketWidth:   bucketWidth,
		FlushInterval: flushInterval,
		SubBuckets:    subBuckets,
		KafkaOpts:     opts.kafkaOpts(),
		Logger:        log,
	})
	if err != nil {
		return nil, fmt.Errorf("demo: site %s: %w", name, err)
	}
	counter := sitecount.NewLocal(sitecount.LocalOptions{SubBuckets: subBuckets})
	lim, err := enforcer.New(enforcer.Config{
		Tuning:    enforcer.Tuning{DefaultShare: 1 / float64(opts.Sites), SubBuckets: subBuckets},
		Rules:     rules.Static(rcfg),
		Site:      name,
		Counter:   counter,
		Snapshot:  snap,
		Publisher: prod,
		Logger:    log,
	})
	if err != nil {
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = prod.Close(cctx)
		return nil, fmt.Errorf("demo: site %s: %w", name, err)
	}
	return &site{name: name, snap: snap, prod: prod, counter: counter, lim: lim}, nil
}

// waitReady polls until the aggregator has joined and every snapshot has caught up and
// has fresh heartbeats for every hits partition, or the timeout passes.
func waitReady(ctx, pipe context.Context, timeout time.Duration, agg *aggregator.Aggregator, sites []*site) error {
	deadline := time.Now().Add(timeout)
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		now := time.Now()
		var waiting []string
		if !agg.Ready() {
			waiting = append(waiting, "aggregator")
		}
		for _, s := range sites {
			if !s.snap.Ready() || len(s.snap.Sources(now)) < hitsPartitions || s.snap.StaleAt(now) {
				waiting = append(waiting, "snapshot "+s.name)
			}
		}
		if len(waiting) == 0 {
			return nil
		}
		if now.After(deadline) {
			return fmt.Errorf("demo: embedded pipeline not ready after %v: waiting for %s", timeout, strings.Join(waiting, ", "))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("demo: interrupted while starting: %w", ctx.Err())
		case <-pipe.Done():
			return errors.New("demo: embedded pipeline stopped while starting")
		case <-t.C:
		}
	}
}
