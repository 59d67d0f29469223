package sim

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/streamlimit/streamlimit/aggregator"
	"github.com/streamlimit/streamlimit/enforcer"
	"github.com/streamlimit/streamlimit/enforcer/rules"
	"github.com/streamlimit/streamlimit/enforcer/snapshot"
	"github.com/streamlimit/streamlimit/internal/clock"
	"github.com/streamlimit/streamlimit/topics"
)

// DCConfig is one run of the data-center simulation: several data centers, each a site with
// its own aggregator counting every data center's hits, joined by links with a latency,
// jitter and cuts, under many clients at once. Every zero field takes the default written in
// its comment.
type DCConfig struct {
	// Scenario is the traffic and faults (DCScenarios). Default DCMix.
	Scenario DCScenario
	// DCs is the number of data centers, each one site with one enforcer. Default 3.
	DCs int
	// WAN is the one-way latency of a link between two data centers (the replicator
	// included). Default 150ms, which with the producer's coalescing, the aggregator's
	// emission and the local hops makes a lag of about 200 ms from a hit to another data
	// center's snapshot.
	WAN time.Duration
	// Jitter is the most a record's link latency varies around WAN (uniform in ±Jitter;
	// records of one stream are never reordered). Default 20ms (100ms for DCJitter).
	Jitter time.Duration
	// Local is the latency of a hop inside a data center (producer to Kafka, counts to the
	// enforcers). Default 5ms.
	Local time.Duration
	// Limit and Window are every client's global limit. Defaults 100 per 10s.
	Limit  int64
	Window time.Duration
	// Windows is the number of measured windows after one warm-up window. Default 6 (10
	// for DCPartition).
	Windows int
	// Clients scales the number of clients of the scenario (the realistic mix: this many).
	// Default 10000 for the mix, fewer for the others (see DCScenario).
	Clients int
	// Seed seeds the traffic. Default 0 is a valid seed.
	Seed uint64
	// Tuning is passed to every enforcer.
	Tuning Tuning
	// SubBuckets is every part's sub-bucket count. Default 60.
	SubBuckets int
	// Algorithm is the global limit's algorithm: "" (sliding window), "token_bucket" or
	// "gcra", with Burst. A global bucket of Burst refilled at Limit per Window is counted
	// as at most Burst in any Burst / rate, and the oracle is that exact sliding log.
	Algorithm string
	Burst     int64
}

// dcRulesYAML is a run's one rule: every client gets Limit per Window, global scope, by
// Algorithm.
func dcRulesYAML(c DCConfig) string {
	extra := ""
	if c.Algorithm != "" {
		extra = fmt.Sprintf(", algorithm: %s, burst: %d", c.Algorithm, c.Burst)
	}
	return fmt.Sprintf("domain: %s\ndescriptors:\n  - key: %s\n    rate_limit: {window: %dms, requests_per_unit: %d%s}\n",
		domain, descKey, c.Window.Milliseconds(), c.Limit, extra)
}

func (c DCConfig) normalize() (DCConfig, error) {
	if c.Scenario == "" {
		c.Scenario = DCMix
	}
	if !slices.Contains(DCScenarios(), c.Scenario) {
		return c, fmt.Errorf("sim: unknown scenario %q (want %v)", c.Scenario, DCScenarios())
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	if c.DCs == 0 {
		c.DCs = 3
	}
	def(&c.WAN, 150*time.Millisecond)
	if c.Scenario == DCJitter {
		def(&c.Jitter, 100*time.Millisecond)
	}
	def(&c.Jitter, 20*time.Millisecond)
	def(&c.Local, 5*time.Millisecond)
	def(&c.Window, 10*time.Second)
	if c.Limit == 0 {
		c.Limit = 100
	}
	if c.Windows == 0 {
		c.Windows = 6
		if c.Scenario == DCPartition {
			c.Windows = 10 // the 60 s cut, then windows after healing
		}
	}
	if c.SubBuckets == 0 {
		c.SubBuckets = 60
	}
	var errs []error
	if c.DCs < 2 || c.DCs > 16 {
		errs = append(errs, fmt.Errorf("sim: DCs %d out of 2..16", c.DCs))
	}
	if c.Jitter >= c.WAN && c.WAN > 0 {
		errs = append(errs, fmt.Errorf("sim: Jitter %v must be below WAN %v", c.Jitter, c.WAN))
	}
	if c.Limit < 1 || c.Windows < 1 || c.Clients < 0 {
		errs = append(errs, fmt.Errorf("sim: Limit %d and Windows %d must be positive, Clients %d not negative", c.Limit, c.Windows, c.Clients))
	}
	for name, d := range map[string]time.Duration{"Window": c.Window, "WAN": c.WAN, "Local": c.Local} {
		if d < time.Millisecond || d%time.Millisecond != 0 {
			errs = append(errs, fmt.Errorf("sim: %s %v must be a positive whole number of milliseconds", name, d))
		}
	}
	return c, errors.Join(errs...)
}

// cut is a link between two data centers that carries nothing from From to To.
type cut struct {
	a, b     int   // data centers (both directions)
	from, to int64 // ms since the start
}

// dcSite is one data center: its enforcer, snapshot, producer model and aggregator.
type dcSite struct {
	name string
	lim  *enforcer.Limiter
	snap *snapshot.Snapshot
	pub  *publisher
	agg  *aggregator.Memory
	// lastHB is when this site's producer last sent site heartbeats (ms since start).
	lastHB int64
}

// transit is a record on its way to a data center's aggregator or snapshot.
type transit struct {
	at  int64 // ms since the start when it arrives
	hit topics.Hit
	em  aggregator.Emission
}

// stream is an ordered stream of records (one Kafka partition seen through a replicator):
// records arrive in the order they were sent.
type stream struct {
	q    []transit
	last int64
}

func (s *stream) push(tr transit) {
	tr.at = max(tr.at, s.last)
	s.last = tr.at
	s.q = append(s.q, tr)
}

// RunDC simulates cfg and returns what it measured. It is deterministic.
func RunDC(ctx context.Context, cfg DCConfig) (DCResult, error) {
	cfg, err := cfg.normalize()
	if err != nil {
		return DCResult{}, err
	}
	rc, err := rules.Parse("sim.yaml", []byte(dcRulesYAML(cfg)))
	if err != nil {
		return DCResult{}, fmt.Errorf("sim: rules: %w", err)
	}
	lim := &rc.Match(domain, request("c0").Descriptors[0]).Limits[0]
	wMs := cfg.Window.Milliseconds()
	durMs := wMs + int64(cfg.Windows)*wMs
	seed := seedFor(cfg.Seed, Scenario(cfg.Scenario), cfg.DCs, float64(cfg.Clients))
	rng := rand.New(rand.NewPCG(seed, seed>>7|1))
	load := dcLoad(rng, cfg, durMs)
	reqs := make([]enforcer.Request, len(load.clients))
	for i := range reqs {
		reqs[i] = request(load.clients[i].name)
	}
	acc := newDCAccounting(cfg, load, lim.GlobalAllowance(), lim.CountWindow())
	var res DCResult
	res.AggregatorErrors, res.SnapshotErrors, err = simulateDCs(ctx, cfg, rc, seed, durMs, load.arrivals, load.cuts, reqs, len(load.clients), acc.decide)
	if err != nil {
		return DCResult{}, err
	}
	res.Config = cfg
	acc.result(&res)
	return res, nil
}

// simulateDCs runs cfg's data centers under rc for durMs: arrivals (in time order) are
// decided by their site's enforcer with reqs[client], and every decision goes to decided.
// It returns the records the aggregators and snapshots refused.
func simulateDCs(ctx context.Context, cfg DCConfig, rc *rules.Config, seed uint64, durMs int64, arrivals []dcArrival, cuts []cut,
	reqs []enforcer.Request, clients int, decided func(dcArrival, bool)) (aggErrs, snapErrs int64, err error) {
	clk := clock.NewFake(Start())
	startMs := Start().UnixMilli()
	sites := make([]*dcSite, cfg.DCs)
	for i := range sites {
		s := &dcSite{name: siteName(i), lastHB: -1 << 40}
		if s.snap, err = snapshot.NewMemory(snapshot.Config{Site: s.name, Clock: clk, SubBuckets: cfg.SubBuckets}); err != nil {
			return 0, 0, err
		}
		if s.agg, err = aggregator.NewMemory(aggregator.Config{SubBuckets: cfg.SubBuckets, MaxKeys: 10 * (clients + 10)}); err != nil {
			return 0, 0, err
		}
		s.pub = &publisher{clk: clk, sub: cfg.SubBuckets, widthMs: 100}
		s.lim, err = enforcer.New(enforcer.Config{
			Rules: enforcer.StaticRules(rc), Site: s.name, Snapshot: s.snap, Publisher: s.pub, Clock: clk,
			SubBuckets: cfg.SubBuckets, MinShare: cfg.Tuning.MinShare, SiteStaleAfter: cfg.Tuning.SiteStaleAfter,
			ShareDamping: cfg.Tuning.ShareDamping, DemandPrior: cfg.Tuning.DemandPrior,
		})
		if err != nil {
			return 0, 0, err
		}
		sites[i] = s
	}
	// hits[i][j]: site i's records on their way to data center j's aggregator; counts[j]:
	// data center j's emissions on their way to its enforcer.
	hits := make([][]stream, cfg.DCs)
	for i := range hits {
		hits[i] = make([]stream, cfg.DCs)
	}
	counts := make([]stream, cfg.DCs)
	localMs, wanMs, jitMs := cfg.Local.Milliseconds(), cfg.WAN.Milliseconds(), cfg.Jitter.Milliseconds()
	linkRng := rand.New(rand.NewPCG(seed^0x5bd1e995, 3))
	delay := func(i, j int, t int64) int64 {
		if i == j {
			return t + localMs
		}
		d := wanMs
		if jitMs > 0 {
			d += linkRng.Int64N(2*jitMs+1) - jitMs
		}
		at := t + localMs + d
		for _, c := range cuts {
			if ((c.a == i && c.b == j) || (c.a == j && c.b == i)) && at >= c.from && t < c.to {
				at = max(at, c.to+d)
			}
		}
		return at
	}
	var (
		recs []pubRec
		out  enforcer.Result
	)
	next := 0
	for t := int64(0); t < durMs; t++ {
		if t%1024 == 0 && ctx.Err() != nil {
			return 0, 0, ctx.Err()
		}
		now := time.UnixMilli(startMs + t).UTC()
		clk.Set(now)
		// 1. Producers: finished buckets every 50 ms, then site heartbeats every 500 ms,
		// stamped with the oldest bucket still held back.
		if t%50 == 0 {
			for i, s := range sites {
				recs = s.pub.flush(startMs+t, recs[:0])
				for _, r := range recs {
					h := topics.Hit{Key: r.key, Site: s.name, BucketStart: r.bucket, Window: r.window, Count: r.n, Denied: r.d}
					for j := range sites {
						hits[i][j].push(transit{at: delay(i, j, t), hit: h})
					}
				}
				if t-s.lastHB >= 500 {
					s.lastHB = t
					h := topics.Hit{Key: topics.SiteHeartbeatKey, Site: s.name, BucketStart: s.pub.watermark(startMs + t)}
					for j := range sites {
						hits[i][j].push(transit{at: delay(i, j, t), hit: h})
					}
				}
			}
		}
		// 2. Every aggregator counts what has reached it.
		for j, s := range sites {
			for i := range sites {
				st := &hits[i][j]
				k := 0
				for ; k < len(st.q) && st.q[k].at <= t; k++ {
					add := s.agg.AddRemote
					if i == j {
						add = s.agg.Add
					}
					if err := add(now, st.q[k].hit); err != nil {
						aggErrs++
					}
				}
				st.q = st.q[k:]
			}
			// 3. It emits every 100 ms, to its own data center's enforcer.
			if t%100 == 0 {
				for _, e := range s.agg.Emit(now) {
					counts[j].push(transit{at: t + localMs, em: e})
				}
			}
			st := &counts[j]
			k := 0
			for ; k < len(st.q) && st.q[k].at <= t; k++ {
				if err := s.snap.Apply(st.q[k].em.Key, st.q[k].em.Value); err != nil {
					snapErrs++
				}
			}
			st.q = st.q[k:]
		}
		// 4. Requests, in arrival order.
		for ; next < len(arrivals) && arrivals[next].t == t; next++ {
			a := arrivals[next]
			sites[a.site].lim.DecideInto(ctx, reqs[a.client], &out)
			decided(a, out.Code == enforcer.CodeOK)
		}
	}
	return aggErrs, snapErrs, nil
}

// watermark is the start of the oldest bucket the producer model still holds back, or
// nowMs: every hit of an earlier bucket has been flushed.
func (p *publisher) watermark(nowMs int64) int64 {
	w := nowMs
	for _, r := range p.pending {
		w = min(w, r.bucket)
	}
	return w
}
