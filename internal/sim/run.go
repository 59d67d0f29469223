package sim

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/streamlimit/streamlimit/aggregator"
	"github.com/streamlimit/streamlimit/clock"
	"github.com/streamlimit/streamlimit/enforcer"
	"github.com/streamlimit/streamlimit/enforcer/rules"
	"github.com/streamlimit/streamlimit/enforcer/sitecount"
	"github.com/streamlimit/streamlimit/enforcer/snapshot"
	"github.com/streamlimit/streamlimit/producer"
	"github.com/streamlimit/streamlimit/topics"
	"github.com/streamlimit/streamlimit/window"
)

// Config is one simulation run. Every zero field takes the default written in its comment.
//
// Every millisecond, in this order: each site's producer model releases the (key, 100 ms
// bucket) counts whose bucket has ended, at the 50 ms flush period of producer.Producer;
// the aggregator counts the hits whose transport delay (Lag/2) has passed; every
// EmitInterval it emits counts and a heartbeat, which reach every site's snapshot after
// the rest of Lag; then the requests of that millisecond are decided, in arrival order.
// Traffic comes from math/rand/v2's PCG with a seed derived from Seed and the traffic
// parameters, so a run is a pure function of its Config.
type Config struct {
	// Scenario is the heavy client's traffic shape. Default Uniform.
	Scenario Scenario
	// Sites is the number of sites, each one enforcer.Engine with its own in-memory
	// snapshot and in-process site counter (sitecount.Local). Default 3.
	Sites int
	// Lag is the pipeline lag added by the transport: half of it (rounded down to the
	// millisecond) delays hits from the producers to the aggregator, the rest delays the
	// aggregator's counts and heartbeats to every site's snapshot. The producer's
	// coalescing (ProducerBucket, FlushInterval) and the emission period (EmitInterval)
	// add their own delay on top (see Config). Zero is a valid lag.
	Lag time.Duration
	// Load is the heavy client's offered load as a multiple of the limit. Default 2.
	Load float64
	// Limit is the heavy client's global limit, requests per Window. Default 100.
	Limit int64
	// Window is the rule's sliding window. Default 10s.
	Window time.Duration
	// Windows is the number of measured windows. Default 10.
	Windows int
	// Warmup is the number of windows run before measuring. Default 1; negative means 0.
	Warmup int
	// Light is the number of light clients, each offering 0.3 × Limit per Window spread
	// uniformly over the sites; none of them should ever be denied. Default 0.
	Light int
	// Seed seeds the traffic (math/rand/v2 PCG). Runs with the same Seed, Scenario, Sites
	// and Load get the same requests whatever the lag. Default 0 is a valid seed.
	Seed uint64
	// Tuning is passed to every enforcer (with SubBuckets and, here, a default share of
	// 1/Sites); zero fields take the enforcer's defaults.
	Tuning enforcer.Tuning
	// ProducerBucket is the producers' coalescing bucket. Default producer.DefaultBucketWidth.
	ProducerBucket time.Duration
	// FlushInterval is the producers' flush period; a flush releases finished buckets.
	// Default defaultFlushInterval.
	FlushInterval time.Duration
	// EmitInterval is the aggregator's emission period. Default aggregator.DefaultEmitInterval.
	EmitInterval time.Duration
	// SubBuckets is the aggregator's and the site counters' sub-buckets per window.
	// Default window.DefaultSubBuckets.
	SubBuckets int
	// Trace, when set, records the series of Result.Trace, as seen from site 0.
	Trace bool
}

// defaultFlushInterval is Config.FlushInterval's default. It is coarser than the
// producer's own (producer.DefaultFlushInterval plus up to producer.DefaultFlushSpread), so
// that the simulated pipeline releases a finished bucket no sooner than the real one; the
// figures of docs/accuracy.md were measured with it.
const defaultFlushInterval = 50 * time.Millisecond

// def sets *p to v when it is the zero value: a config field left unset takes its default.
func def[T comparable](p *T, v T) {
	var zero T
	if *p == zero {
		*p = v
	}
}

func (c Config) normalize() (Config, error) {
	if c.Scenario == "" {
		c.Scenario = Uniform
	}
	if _, err := ParseScenario(string(c.Scenario)); err != nil {
		return c, err
	}
	def(&c.Sites, 3)
	def(&c.Load, 2)
	def(&c.Limit, 100)
	def(&c.Window, 10*time.Second)
	def(&c.Windows, 10)
	def(&c.Warmup, 1)
	c.Warmup = max(c.Warmup, 0)
	def(&c.ProducerBucket, producer.DefaultBucketWidth)
	def(&c.FlushInterval, defaultFlushInterval)
	def(&c.EmitInterval, aggregator.DefaultEmitInterval)
	def(&c.SubBuckets, window.DefaultSubBuckets)
	var errs []error
	if c.Sites < 1 || c.Sites > 64 {
		errs = append(errs, fmt.Errorf("sim: Sites %d out of 1..64", c.Sites))
	}
	if c.Lag < 0 {
		errs = append(errs, fmt.Errorf("sim: Lag %v is negative", c.Lag))
	}
	if c.Load <= 0 || c.Limit < 1 || c.Windows < 1 || c.Light < 0 {
		errs = append(errs, fmt.Errorf("sim: Load %v, Limit %d and Windows %d must be positive, Light %d not negative", c.Load, c.Limit, c.Windows, c.Light))
	}
	for name, d := range map[string]time.Duration{"Window": c.Window, "ProducerBucket": c.ProducerBucket,
		"FlushInterval": c.FlushInterval, "EmitInterval": c.EmitInterval} {
		if d < time.Millisecond || d%time.Millisecond != 0 {
			errs = append(errs, fmt.Errorf("sim: %s %v must be a positive whole number of milliseconds", name, d))
		}
	}
	return c, errors.Join(errs...)
}

// Start returns the virtual instant every run starts at, 2026-01-01T00:00:00Z (aligned to
// any window of whole seconds up to a day).
func Start() time.Time { return time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC) }

const (
	domain    = "sim"
	descKey   = "client"
	heavyName = "heavy"
)

// rulesYAML is the one rule: every client value gets Limit per Window, global scope.
func rulesYAML(limit int64, w time.Duration) string {
	return dcRulesYAML(DCConfig{Limit: limit, Window: w})
}

// LoadRules loads the simulation's rule through the real rules loader.
func LoadRules(limit int64, w time.Duration) (*rules.Config, error) {
	rc, err := rules.Parse("sim.yaml", []byte(rulesYAML(limit, w)))
	if err != nil {
		return nil, fmt.Errorf("sim: rules: %w", err)
	}
	return rc, nil
}

// pubRec is a producer's coalesced count of one (key, window, bucket).
type pubRec struct {
	key    string
	window int64 // ms
	bucket int64 // ms
	n, d   int64
}

// publisher models producer.Producer: it coalesces the hits of each (key, window, bucket)
// and releases a bucket at the first flush at or after the bucket's end, as the real
// producer's background flush does. It implements enforcer.Publisher.
type publisher struct {
	clk     clock.Clock
	sub     int
	widthMs int64
	pending []pubRec
}

func (p *publisher) Hit(key string, window time.Duration, n int) { p.add(key, window, int64(n), 0) }

func (p *publisher) Denied(key string, window time.Duration, n int) { p.add(key, window, 0, int64(n)) }

func (p *publisher) add(key string, wd time.Duration, n, d int64) {
	ms := p.clk.Now().UnixMilli()
	b := ms - ms%p.widthMs
	w := wd.Milliseconds()
	if sub := window.Width(wd, p.sub); sub%p.widthMs != 0 {
		b = max(b, ms-ms%sub)
	}
	for i := range p.pending {
		r := &p.pending[i]
		if r.key == key && r.window == w && r.bucket == b {
			r.n += n
			r.d += d
			return
		}
	}
	p.pending = append(p.pending, pubRec{key: key, window: w, bucket: b, n: n, d: d})
}

// end returns the end of r's bucket: the producer bucket, cut at the sub-bucket boundary.
func (p *publisher) end(r pubRec) int64 {
	e := r.bucket - r.bucket%p.widthMs + p.widthMs
	if sub := window.Width(time.Duration(r.window)*time.Millisecond, p.sub); sub%p.widthMs != 0 {
		e = min(e, r.bucket-r.bucket%sub+sub)
	}
	return e
}

// flush removes and returns the finished buckets at nowMs, in the order they were opened.
func (p *publisher) flush(nowMs int64, dst []pubRec) []pubRec {
	keep := p.pending[:0]
	for _, r := range p.pending {
		if p.end(r) <= nowMs {
			dst = append(dst, r)
		} else {
			keep = append(keep, r)
		}
	}
	p.pending = keep
	return dst
}

type hitMsg struct {
	at  int64 // ms since start when the aggregator consumes it
	hit topics.Hit
}

type countMsg struct {
	at  int64
	rec aggregator.Emission
}

type site struct {
	name string
	lim  *enforcer.Engine
	snap *snapshot.Snapshot
	ctr  *sitecount.Local
	pub  *publisher
}

// Run simulates cfg and returns its statistics. It is deterministic: the same cfg gives
// the same Result.
func Run(ctx context.Context, cfg Config) (Result, error) {
	cfg, err := cfg.normalize()
	if err != nil {
		return Result{}, err
	}
	rc, err := LoadRules(cfg.Limit, cfg.Window)
	if err != nil {
		return Result{}, err
	}
	return run(ctx, cfg, rc)
}

func run(ctx context.Context, cfg Config, rc *rules.Config) (Result, error) {
	wMs := cfg.Window.Milliseconds()
	warmMs := int64(cfg.Warmup) * wMs
	durMs := warmMs + int64(cfg.Windows)*wMs
	perMs := cfg.Load * float64(cfg.Limit) / float64(wMs)
	seed := seedFor(cfg.Seed, cfg.Scenario, cfg.Sites, cfg.Load)
	rng := rand.New(rand.NewPCG(seed, seed>>7|1))
	heavy := Arrivals(rng, cfg.Scenario, cfg.Sites, durMs, perMs, 0.5*float64(cfg.Limit)/float64(wMs))
	type lightReq struct {
		Arrival
		client int
	}
	var light []lightReq
	for c := range cfg.Light {
		for _, a := range Arrivals(rng, Uniform, cfg.Sites, durMs, 0.3*float64(cfg.Limit)/float64(wMs), 0) {
			light = append(light, lightReq{a, c})
		}
	}
	slices.SortStableFunc(light, func(a, b lightReq) int { return int(a.T - b.T) })

	clk := clock.NewFake(Start())
	startMs := Start().UnixMilli()
	agg, err := aggregator.NewMemory(aggregator.Config{SubBuckets: cfg.SubBuckets, EmitInterval: cfg.EmitInterval})
	if err != nil {
		return Result{}, err
	}
	sites := make([]*site, cfg.Sites)
	for i := range sites {
		s := &site{name: siteName(i)}
		if s.snap, err = snapshot.NewMemory(snapshot.Config{Site: s.name, Clock: clk}); err != nil {
			return Result{}, err
		}
		s.ctr = sitecount.NewLocal(sitecount.LocalOptions{SubBuckets: cfg.SubBuckets})
		s.pub = &publisher{clk: clk, sub: cfg.SubBuckets, widthMs: cfg.ProducerBucket.Milliseconds()}
		tuning := cfg.Tuning
		tuning.SubBuckets, tuning.DefaultShare = cfg.SubBuckets, 1/float64(cfg.Sites)
		s.lim, err = enforcer.New(enforcer.Config{
			Tuning:    tuning,
			Rules:     rules.Static(rc),
			Site:      s.name,
			Counter:   s.ctr,
			Snapshot:  s.snap,
			Publisher: s.pub,
			Clock:     clk,
		})
		if err != nil {
			return Result{}, err
		}
		sites[i] = s
	}

	hitLag := cfg.Lag.Milliseconds() / 2
	countLag := cfg.Lag.Milliseconds() - hitLag
	flushMs, emitMs := cfg.FlushInterval.Milliseconds(), cfg.EmitInterval.Milliseconds()
	var (
		hitQ   []hitMsg // FIFO: constant lag keeps it sorted
		countQ []countMsg
		recs   []pubRec
		res    Result
		acc    = newAccounting(cfg.Limit, wMs, warmMs)
		reqs   = make([]enforcer.Request, 0, 1+cfg.Light)
		out    enforcer.Result
		key    string // the heavy client's counter key, learnt from the first decision
	)
	reqs = append(reqs, request(heavyName))
	for c := range cfg.Light {
		reqs = append(reqs, request(fmt.Sprintf("light-%d", c)))
	}
	hi, li := 0, 0
	traceEvery := max(wMs/400, 10)
	for t := int64(0); t < durMs; t++ {
		if t%1024 == 0 && ctx.Err() != nil {
			return Result{}, ctx.Err()
		}
		now := time.UnixMilli(startMs + t).UTC()
		clk.Set(now)
		// 1. Producers release finished buckets into the hits pipe.
		if t%flushMs == 0 {
			for _, s := range sites {
				recs = s.pub.flush(startMs+t, recs[:0])
				for _, r := range recs {
					hitQ = append(hitQ, hitMsg{at: t + hitLag, hit: topics.Hit{Key: r.key, Site: s.name, BucketStart: r.bucket, Window: r.window, Count: r.n, Denied: r.d}})
				}
			}
		}
		// 2. The aggregator consumes what has arrived.
		k := 0
		for ; k < len(hitQ) && hitQ[k].at <= t; k++ {
			if err := agg.Add(now, hitQ[k].hit); err != nil {
				res.AggregatorErrors++
			}
		}
		hitQ = hitQ[k:]
		// 3. It emits counts and heartbeats, which every site receives countLag later.
		if t%emitMs == 0 {
			for _, e := range agg.Emit(now) {
				countQ = append(countQ, countMsg{at: t + countLag, rec: e})
			}
		}
		k = 0
		for ; k < len(countQ) && countQ[k].at <= t; k++ {
			for _, s := range sites {
				if err := s.snap.Apply(countQ[k].rec.Key, countQ[k].rec.Value); err != nil {
					res.SnapshotErrors++
				}
			}
		}
		countQ = countQ[k:]
		// 4. Requests decide, in arrival order: the heavy client's, then the light ones'.
		for ; hi < len(heavy) && heavy[hi].T == t; hi++ {
			s := sites[heavy[hi].Site]
			s.lim.DecideInto(ctx, reqs[0], &out)
			ok := out.Code == enforcer.CodeOK
			if key == "" && len(out.Statuses) > 0 {
				key = out.Statuses[0].Key
			}
			acc.decide(t, ok)
			if cfg.Trace && t >= warmMs {
				res.Trace.Decisions = append(res.Trace.Decisions, TraceDecision{T: t, Site: heavy[hi].Site, Allowed: ok})
			}
		}
		for ; li < len(light) && light[li].T == t; li++ {
			sites[light[li].Site].lim.DecideInto(ctx, reqs[1+light[li].client], &out)
			res.LightRequests++
			if out.Code != enforcer.CodeOK {
				res.LightDenied++
			}
		}
		acc.tick(t)
		if cfg.Trace && t%traceEvery == 0 {
			res.Trace.Points = append(res.Trace.Points, tracePoint(t, now, acc, sites[0], key, cfg.Window))
		}
	}
	res.Config = cfg
	acc.result(&res)
	res.Ideal = Oracle(heavy, cfg.Limit, wMs, warmMs)
	if cfg.Trace {
		res.Trace.WindowMs, res.Trace.WarmupMs, res.Trace.Limit = wMs, warmMs, cfg.Limit
	}
	return res, nil
}

func siteName(i int) string { return fmt.Sprintf("dc%d", i+1) }

func request(client string) enforcer.Request {
	return enforcer.Request{Domain: domain, Descriptors: [][]rules.Entry{{{Key: descKey, Value: client}}}}
}

// tracePoint records, at t, the exact sliding count of admitted requests over all sites
// and site s's estimate of it: the remote part of its snapshot plus its exact local count,
// which is what the enforcer compares with the limit (docs/architecture.md, invariant 3).
func tracePoint(t int64, now time.Time, acc *accounting, s *site, key string, w time.Duration) TracePoint {
	p := TracePoint{T: t, Exact: acc.count(t)}
	if key == "" {
		return p
	}
	var local [1]float64
	_ = s.ctr.Counts(context.Background(), now, []sitecount.Op{{Key: key, Window: w}}, local[:])
	p.Local = local[0]
	if e, ok := s.snap.Get(key); ok && e.Window == w && !e.Expired(now) {
		p.Remote = e.Remote()
	}
	return p
}
