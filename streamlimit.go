// Package streamlimit puts an enforcer inside a Go service: New assembles, from one Config,
// the rules (reloaded when their file changes), this site's counters (in process, or in the
// data center's Redis), the snapshot of the counts topic and the producer of hits, as the
// `streamlimit enforcer` command does; Run keeps them current; Decide and Allow decide; Close
// delivers the last hits and tells the other sites that this one left.
//
//	lim, err := streamlimit.New(streamlimit.Config{Site: "eu-1", Rules: "rules.yaml", Brokers: []string{"kafka:9092"}})
//	...
//	go lim.Run(ctx)
//	defer lim.Close(context.Background())
//	if !lim.Allow(ctx, "api", "user", "42") { /* 429 */ }
//
// Without Brokers nothing is shared with other sites: every limit, global ones included, is
// counted by this process alone. The parts are reachable (Engine, Snapshot, Producer) for
// what the Limiter does not wrap: package enforcer's Await, package httplimit's middleware.
package streamlimit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamlimit/streamlimit/clock"
	"github.com/streamlimit/streamlimit/enforcer"
	"github.com/streamlimit/streamlimit/enforcer/algo"
	"github.com/streamlimit/streamlimit/enforcer/rules"
	"github.com/streamlimit/streamlimit/enforcer/sitecount"
	"github.com/streamlimit/streamlimit/enforcer/sitestore"
	"github.com/streamlimit/streamlimit/enforcer/snapshot"
	"github.com/streamlimit/streamlimit/internal/memsize"
	"github.com/streamlimit/streamlimit/producer"
	"github.com/streamlimit/streamlimit/serve/httplimit"
	"github.com/streamlimit/streamlimit/topics"
)

// Config configures a Limiter. Site is required, and one of Rules and RuleSet; every other
// zero field takes the default of the package that owns the setting, named in its comment.
type Config struct {
	// Site names this process's site: the process itself, or, with Redis, the data center
	// whose enforcers share it (docs/sites.md).
	Site string
	// Rules is the rules file or directory, checked for changes every ReloadInterval
	// (default rules.DefaultReloadInterval); a broken edit keeps the last good rules. A
	// change is loaded once it has stayed as it is for ReloadSettle (default
	// rules.DefaultReloadSettle), so that a file rewritten in place is not loaded
	// half-written.
	Rules          string
	ReloadInterval time.Duration
	ReloadSettle   time.Duration
	// RuleSet, set instead of Rules, is the rules in force for the Limiter's life: rules
	// made in code (rules.Parse of a document the service holds). Nothing is reloaded.
	RuleSet *rules.Config
	// Load says how the rules files are read (envoyproxy/ratelimit compatibility, domain
	// merge, the bound on a file's size).
	Load rules.LoadOptions

	// Brokers are the Kafka bootstrap servers, with KafkaOpts (TLS, SASL, ...). Without
	// them the Limiter counts every limit in this process alone.
	Brokers   []string
	KafkaOpts []kgo.Opt
	// HitsTopic and CountsTopic default to topics.DefaultHitsTopic and
	// topics.DefaultCountsTopic.
	HitsTopic, CountsTopic string
	// Aggregators, when set, are the only aggregator instances whose count records are
	// believed (snapshot.Config.Aggregators).
	Aggregators []string
	// SiteKey, when set, is Site's key: every record the producer writes carries its proof
	// of Site, which aggregators given the site keys require (producer.Config.SiteKey).
	SiteKey []byte
	// MaxStaleness is how old the counts may be before global limits are decided on local
	// shares (default snapshot.DefaultMaxStaleness).
	MaxStaleness time.Duration

	// Redis, when its Addrs (or Client) are set, holds site limits and this site's count
	// of global limits for every enforcer of the site. Default: counted in process.
	Redis sitestore.Redis
	// SiteEnforcers is the number of enforcers sharing Redis: while it is down each keeps
	// to 1/SiteEnforcers of the site's limits. Default 1.
	SiteEnforcers int

	// Tuning is the global decision's settings and the bounds of the per-key structures
	// (enforcer.Tuning, whose zero fields take enforcer.Defaults; MaxKeys bounds every
	// per-key structure here, not only the enforcer's).
	enforcer.Tuning
	// MaxMemory is the per-key structures' memory target in bytes, half of it kept alive
	// (0: no bound in bytes).
	MaxMemory int64

	// Clock defaults to the wall clock, Logger to slog.Default(); Registerer receives the
	// metrics (nil: none).
	Clock      clock.Clock
	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

// Limiter is an enforcer assembled for a Go service. Decide and Allow are safe for
// simultaneous use by multiple goroutines; Run runs once; Close is called once, when the
// service stops (with Run still running or not).
type Limiter struct {
	cfg      Config
	log      *slog.Logger
	reloader *rules.Reloader
	local    *algo.Store
	counter  *sitecount.Local
	site     *sitestore.Store
	snap     *snapshot.Snapshot
	prod     *producer.Producer
	lim      *enforcer.Engine

	closeOnce sync.Once
	closeErr  error
}

// New assembles a Limiter. On error nothing is left open.
func New(cfg Config) (_ *Limiter, err error) {
	if cfg.Site == "" {
		return nil, errors.New("streamlimit: Config.Site is required")
	}
	if (cfg.Rules == "") == (cfg.RuleSet == nil) {
		return nil, errors.New("streamlimit: one of Config.Rules (a path) and Config.RuleSet is required")
	}
	if cfg.HitsTopic == "" {
		cfg.HitsTopic = topics.DefaultHitsTopic
	}
	if cfg.CountsTopic == "" {
		cfg.CountsTopic = topics.DefaultCountsTopic
	}
	if cfg.MaxKeys <= 0 {
		cfg.MaxKeys = enforcer.Defaults().MaxKeys
	}
	cfg.Clock = clock.Or(cfg.Clock)
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	l := &Limiter{cfg: cfg, log: cfg.Logger}
	defer func() {
		if err != nil {
			l.release(context.Background())
		}
	}()
	current := rules.Static(cfg.RuleSet)
	if cfg.RuleSet == nil {
		if l.reloader, err = rules.NewReloader(cfg.Rules, rules.ReloaderOptions{Interval: cfg.ReloadInterval, Settle: cfg.ReloadSettle, Logger: l.log, Clock: cfg.Clock, Load: cfg.Load}); err != nil {
			return nil, err
		}
		current = l.reloader.Current
	}
	mem := memsize.Split(cfg.MaxMemory)
	l.local = algo.New(algo.Options{MaxKeys: cfg.MaxKeys, MaxBytes: mem.Local})
	l.counter = sitecount.NewLocal(sitecount.LocalOptions{SubBuckets: cfg.SubBuckets, MaxKeys: cfg.MaxKeys, MaxBytes: mem.Counter})
	ecfg := enforcer.Config{
		Tuning:        cfg.Tuning,
		Rules:         current,
		Site:          cfg.Site,
		Local:         l.local,
		Counter:       l.counter,
		KeyCacheBytes: mem.KeyCache,
		Clock:         cfg.Clock,
		Logger:        l.log,
		Registerer:    cfg.Registerer,
	}
	share := fallbackShare(cfg.SiteEnforcers)
	redis := len(cfg.Redis.Addrs) > 0 || cfg.Redis.Client != nil
	if redis {
		if l.site, err = sitestore.New(sitestore.Config{Redis: cfg.Redis, Fallback: l.local, FallbackShare: share,
			Clock: cfg.Clock, Logger: l.log, Registerer: cfg.Registerer}); err != nil {
			return nil, fmt.Errorf("streamlimit: redis: %w", err)
		}
		ecfg.SiteStore = l.site
		ecfg.Counter = sitestore.NewCounter(l.site, sitestore.CounterOptions{SubBuckets: cfg.SubBuckets, Fallback: l.counter, FallbackShare: share})
	}
	if len(cfg.Brokers) > 0 || len(cfg.KafkaOpts) > 0 {
		if l.snap, err = snapshot.New(snapshot.Config{
			Brokers: cfg.Brokers, KafkaOpts: cfg.KafkaOpts, Topic: cfg.CountsTopic, Site: cfg.Site, Aggregators: cfg.Aggregators,
			MaxStaleness: cfg.MaxStaleness, MaxKeys: cfg.MaxKeys, MaxBytes: mem.Snapshot, SubBuckets: cfg.SubBuckets,
			Clock: cfg.Clock, Logger: l.log, Registerer: cfg.Registerer,
		}); err != nil {
			return nil, fmt.Errorf("streamlimit: snapshot: %w", err)
		}
		// The site heartbeats say what counts this site, so that the aggregators can report
		// two processes given one site without a shared Redis.
		instance := instanceID()
		counter := "process:" + instance
		if redis {
			counter = "redis:" + strings.Join(cfg.Redis.Addrs, ",")
		}
		if l.prod, err = producer.New(producer.Config{
			Brokers: cfg.Brokers, KafkaOpts: cfg.KafkaOpts, Topic: cfg.HitsTopic, Site: cfg.Site,
			Instance: instance, Counter: counter, SubBuckets: cfg.SubBuckets, SiteKey: cfg.SiteKey,
			Clock: cfg.Clock, Logger: l.log, Registerer: cfg.Registerer,
		}); err != nil {
			return nil, fmt.Errorf("streamlimit: producer: %w", err)
		}
		// RLQS usage reports go out as bulk hits: however many buckets they bring, the
		// decisions' hits keep their part of the producer's buffer.
		ecfg.Snapshot, ecfg.Publisher, ecfg.ReportPublisher = l.snap, l.prod, l.prod.Bulk()
	}
	if l.lim, err = enforcer.New(ecfg); err != nil {
		return nil, err
	}
	l.registerMetrics(cfg.Registerer)
	return l, nil
}

// Run keeps the Limiter current until ctx is done: it reloads the rules, follows the counts
// topic and drops idle counters. It returns nil when ctx is done, or the first part's error.
// Decisions do not wait for it: before the counts topic is restored (WaitReady), global
// limits are decided on what has been read so far.
func (l *Limiter) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	goRun := func(part string, f func() error) {
		wg.Go(func() {
			if err := f(); err != nil && !errors.Is(err, context.Canceled) {
				mu.Lock()
				if first == nil {
					first = fmt.Errorf("streamlimit: %s: %w", part, err)
				}
				mu.Unlock()
				cancel()
			}
		})
	}
	if l.reloader != nil {
		goRun("rules reloader", func() error { return l.reloader.Run(ctx) })
	}
	if l.snap != nil {
		goRun("snapshot", func() error { return l.snap.Run(ctx) })
	}
	goRun("sweeper", func() error { l.sweep(ctx); return nil })
	wg.Wait()
	return first
}

// sweep drops idle counters now and then, so that memory follows the active keys.
func (l *Limiter) sweep(ctx context.Context) {
	t := time.NewTicker(10 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			now := l.cfg.Clock.Now()
			l.local.Sweep(now)
			l.counter.Sweep(now)
		}
	}
}

// WaitReady returns once the counts topic is restored (at once without Kafka), or ctx's
// error.
func (l *Limiter) WaitReady(ctx context.Context) error {
	if l.snap == nil {
		return nil
	}
	return l.snap.WaitReady(ctx)
}

// Ready reports whether the Limiter decides on complete data, and why (for readiness
// probes): without Kafka always; with it once the counts topic is restored, while this
// host's clock agrees with the aggregators' (snapshot.Snapshot.CheckClock).
func (l *Limiter) Ready() (bool, string) {
	if l.snap == nil {
		return true, "no Kafka configured: every limit is counted at this site alone"
	}
	if !l.snap.Ready() {
		return false, "restoring the counts topic"
	}
	if err := l.snap.CheckClock(); err != nil {
		return false, err.Error()
	}
	if l.snap.Stale() {
		return true, fmt.Sprintf("counts are %v old: global limits use local shares", l.snap.Age().Round(time.Millisecond))
	}
	return true, "snapshot restored and fresh"
}

// Decide decides req (package enforcer: a domain and descriptors of key/value entries).
func (l *Limiter) Decide(ctx context.Context, req enforcer.Request) enforcer.Result {
	return l.lim.Decide(ctx, req)
}

// Allow decides one request of one descriptor, given as key, value pairs in order ("user",
// "42", "method", "POST"), in domain, and reports whether it is admitted. An odd number of
// kv is a programming error, and Allow panics (as strings.NewReplacer does) rather than
// decide on a descriptor without its last key.
func (l *Limiter) Allow(ctx context.Context, domain string, kv ...string) bool {
	if len(kv)%2 != 0 {
		panic(fmt.Sprintf("streamlimit: Allow with an odd number of key, value arguments (%d)", len(kv)))
	}
	entries := make([]rules.Entry, 0, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		entries = append(entries, rules.Entry{Key: kv[i], Value: kv[i+1]})
	}
	return l.lim.Decide(ctx, enforcer.Request{Domain: domain, Descriptors: [][]rules.Entry{entries}}).Code == enforcer.CodeOK
}

// Middleware returns net/http middleware that decides each request on the descriptors cfg
// builds from it (package httplimit: client address, headers, route...) and answers 429
// with the rate-limit header fields when it is refused.
func (l *Limiter) Middleware(cfg httplimit.Config) (*httplimit.Middleware, error) {
	return httplimit.New(l.lim, httplimit.Options{Config: cfg, Logger: l.log})
}

// Engine returns the decision engine, for what the Limiter does not wrap (Await, or a front
// door of one's own).
func (l *Limiter) Engine() *enforcer.Engine { return l.lim }

// Snapshot returns the snapshot of the counts topic, nil without Kafka.
func (l *Limiter) Snapshot() *snapshot.Snapshot { return l.snap }

// Producer returns the producer of hits, nil without Kafka.
func (l *Limiter) Producer() *producer.Producer { return l.prod }

// Close delivers the hits not yet published and writes this site's leave record, so that
// no other site keeps reserving room for it (bounded by ctx: give it a deadline), then
// releases Redis. Call it when the service stops; decisions made after it are not
// published. It returns the producer's error, if any hits were lost.
func (l *Limiter) Close(ctx context.Context) error {
	l.closeOnce.Do(func() { l.closeErr = l.release(ctx) })
	return l.closeErr
}

func (l *Limiter) release(ctx context.Context) error {
	var err error
	if l.prod != nil {
		err = l.prod.Close(ctx)
	}
	if l.site != nil {
		_ = l.site.Close()
	}
	return err
}

// registerMetrics registers the gauges and counters of the parts New made itself.
func (l *Limiter) registerMetrics(reg prometheus.Registerer) {
	if reg == nil {
		return
	}
	gauge := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "streamlimit", Subsystem: "enforcer", Name: name, Help: help}, f)
	}
	counter := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "streamlimit", Subsystem: "enforcer", Name: name, Help: help}, f)
	}
	for _, c := range []prometheus.Collector{
		gauge("local_keys", "Local-scope counters held.", func() float64 { return float64(l.local.Stats().Keys) }),
		counter("local_evicted_idle_total", "Local counters dropped because idle.", func() float64 { return float64(l.local.Stats().EvictedIdle) }),
		counter("local_evicted_live_total", "Local counters dropped while live, to keep within the bound.", func() float64 { return float64(l.local.Stats().EvictedLive) }),
		counter("local_refused_keys_total", "New local keys not counted because the local counters were full of counters at or near their limits (--max-memory, --max-keys).", func() float64 { return float64(l.local.Stats().Refused) }),
		gauge("global_keys", "Global keys with a count of this site held in process.", func() float64 { return float64(l.counter.Len()) }),
		counter("global_refused_keys_total", "New global keys not counted at this site because its counter was full of counters at or near their caps (--max-memory, --max-keys).", func() float64 { return float64(l.counter.Refused()) }),
		counter("global_evicted_total", "Global site counters dropped to keep within the bound.", func() float64 { return float64(l.counter.Evicted()) }),
		gauge("local_bytes", "Bytes the local counters keep alive, by the estimate --max-memory bounds.", func() float64 { return float64(l.local.Bytes()) }),
		gauge("global_bytes", "Bytes this site's in-process global counters keep alive, by the estimate --max-memory bounds.", func() float64 { return float64(l.counter.Bytes()) }),
	} {
		if err := reg.Register(c); err != nil {
			l.log.Warn("metric not registered", "err", err)
		}
	}
	if l.reloader == nil {
		return
	}
	for _, c := range []prometheus.Collector{
		counter("rules_reloads_total", "Successful rules reloads.", func() float64 { return float64(l.reloader.Stats().Reloads) }),
		counter("rules_reload_errors_total", "Rejected rules edits (the last good rules stay in force).", func() float64 { return float64(l.reloader.Stats().Failures) }),
	} {
		if err := reg.Register(c); err != nil {
			l.log.Warn("metric not registered", "err", err)
		}
	}
}

// fallbackShare is each enforcer's part of the site's limits while Redis is down.
func fallbackShare(n int) float64 {
	if n <= 1 {
		return 1
	}
	return 1 / float64(n)
}

// instanceID names this process: "<hostname>-<pid>-<random>".
func instanceID() string {
	host, _ := os.Hostname()
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}
