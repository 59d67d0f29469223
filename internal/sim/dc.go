package sim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/streamlimit/streamlimit/aggregator"
	"github.com/streamlimit/streamlimit/clock"
	"github.com/streamlimit/streamlimit/enforcer"
	"github.com/streamlimit/streamlimit/enforcer/rules"
	"github.com/streamlimit/streamlimit/enforcer/snapshot"
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
	// Tuning is passed to every enforcer (with SubBuckets); zero fields take the
	// enforcer's defaults.
	Tuning enforcer.Tuning
	// SubBuckets is every part's sub-bucket count. Default 60.
	SubBuckets int
	// Algorithm is the global limit's algorithm: "" (sliding window), "token_bucket" or
	// "gcra", with Burst. A global bucket of Burst refilled at Limit per Window is counted
	// as at most Burst in any Burst / rate, and the oracle is that exact sliding log.
	Algorithm string
	Burst     int64

	// Procs is the number of enforcer processes of each data center at the start, each a
	// site of its own counting in process (named "<dc>-p<k>"), among which a data
	// center's requests are spread at random. Default 1 (the data center is one site, as
	// with a shared Redis), 6 for the churn scenarios.
	Procs int
	// NoChurn runs a churn scenario's traffic on its data centers of Procs processes with
	// none of its starts and stops: its control, which tells what the churn itself costs
	// from what the many small sites cost.
	NoChurn bool

	// ClockSkew, when set, puts every host's clock off true time by up to ClockSkew either
	// way: each data center's aggregator and each of its enforcer processes gets an offset,
	// spread evenly from −ClockSkew to +ClockSkew over the hosts in an order drawn from
	// Seed. Default 0: every clock is right.
	ClockSkew time.Duration
	// ClockOffsets are added to the clocks of data center i's enforcer processes (its
	// aggregator keeps its own): a site whose clock is off.
	ClockOffsets []time.Duration

	// heartbeatsCrossCuts lets site heartbeats through cut links while hits stay cut: a
	// broken replicator that the sites cannot notice, for the tests' control runs.
	heartbeatsCrossCuts bool
	// forge, when set, returns the records an attacker allowed to write the hits topics
	// writes at t (ms since the start) into data center dc's, which reach every aggregator
	// at once: forged site records, for the tests of site records no site wrote.
	forge func(t int64, dc int) []topics.Hit
	// split runs a per-site split limiter instead of the global one, the reference the
	// reserve-margin sweep plots: every site decides alone (no snapshot) on a fixed share
	// of each limit, one over the number of sites at the start.
	split bool
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
	if c.Procs == 0 {
		c.Procs = 1
		if c.Scenario.churns() {
			c.Procs = 6
		}
	}
	var errs []error
	if c.DCs < 2 || c.DCs > 16 {
		errs = append(errs, fmt.Errorf("sim: DCs %d out of 2..16", c.DCs))
	}
	if c.Procs < 1 || c.Procs > 16 {
		errs = append(errs, fmt.Errorf("sim: Procs %d out of 1..16", c.Procs))
	}
	if c.Jitter >= c.WAN && c.WAN > 0 {
		errs = append(errs, fmt.Errorf("sim: Jitter %v must be below WAN %v", c.Jitter, c.WAN))
	}
	if c.ClockSkew < 0 || len(c.ClockOffsets) > c.DCs {
		errs = append(errs, fmt.Errorf("sim: ClockSkew %v must not be negative, and ClockOffsets (%d) name at most DCs (%d)", c.ClockSkew, len(c.ClockOffsets), c.DCs))
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

// dcSite is one data center: its aggregator, the latest record of every key of its counts
// topic (what a process that starts reads first), and its enforcer processes.
type dcSite struct {
	name      string
	agg       *aggregator.Memory
	compacted map[string][]byte
	procs     []*dcProc // serving, in the order they started
}

// dcProc is one enforcer process of a data center: a site of its own (DCConfig.Procs), or
// the whole data center when it runs one; with its own snapshot of the data center's
// counts, producer model and site heartbeats.
type dcProc struct {
	name     string // its site
	clk      offsetClock
	instance string // its producer instance: a restart under the same site is another
	lim      *enforcer.Engine
	snap     *snapshot.Snapshot
	pub      *publisher
	// lastHB is when this process last sent site heartbeats (ms since start).
	lastHB int64
}

// procName is the site of process k of data center dc: the data center's own name when it
// runs one process.
func procName(dc string, k, procs int) string {
	if procs == 1 {
		return dc
	}
	return fmt.Sprintf("%s-p%d", dc, k)
}

// churnKind is what happens to a process.
type churnKind uint8

const (
	churnLeave churnKind = iota // it stops cleanly: pending hits delivered, then a leave record
	churnCrash                  // it stops at once: pending hits lost, nothing said
	churnStart                  // it starts, reading the counts topic before it serves
)

// churnEvent starts or stops process proc of data center dc at t (ms since the start).
type churnEvent struct {
	t    int64
	dc   int
	proc string
	kind churnKind
}

// transit is a record on its way to a data center's aggregator or snapshot.
type transit struct {
	at  int64 // ms since the start when it arrives
	hit topics.Hit
	em  aggregator.Emission
	rep []byte // an aggregator's lag report, in place of hit
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
	res.AggregatorErrors, res.SnapshotErrors, res.Clocks, err = simulateDCs(ctx, cfg, rc, seed, durMs, load.arrivals, load.cuts, load.churn, reqs, len(load.clients), acc.decide)
	if err != nil {
		return DCResult{}, err
	}
	res.Config = cfg
	acc.result(&res)
	return res, nil
}

// simulateDCs runs cfg's data centers under rc for durMs: arrivals (in time order) are
// decided by one of their data center's serving processes with reqs[client], and every
// decision goes to decided; churn starts and stops processes. It returns the records the
// aggregators and snapshots refused, and what each process's snapshot showed of its clock.
func simulateDCs(ctx context.Context, cfg DCConfig, rc *rules.Config, seed uint64, durMs int64, arrivals []dcArrival, cuts []cut,
	churn []churnEvent, reqs []enforcer.Request, clients int, decided func(dcArrival, bool)) (aggErrs, snapErrs int64, clocks []ProcClock, err error) {
	clk := clock.NewFake(Start())
	startMs := Start().UnixMilli()
	sites := make([]*dcSite, cfg.DCs)
	hc := newHostClocks(cfg, seed)
	clockOf := map[string]int{} // process name → its index in clocks
	incarnation := 0
	startProc := func(dc *dcSite, d int, name string) error {
		incarnation++
		p := &dcProc{name: name, instance: fmt.Sprintf("%s#%d", name, incarnation), lastHB: -1 << 40,
			clk: offsetClock{base: clk, off: hc.proc(d, name)}}
		if _, ok := clockOf[name]; !ok {
			clockOf[name] = len(clocks)
			clocks = append(clocks, ProcClock{Site: name, Offset: p.clk.off})
		}
		var err error
		if p.snap, err = snapshot.NewMemory(snapshot.Config{Site: name, Clock: p.clk, SubBuckets: cfg.SubBuckets}); err != nil {
			return err
		}
		// A new process reads the compacted counts topic before it serves.
		for _, k := range slices.Sorted(maps.Keys(dc.compacted)) {
			if err := p.snap.Apply([]byte(k), dc.compacted[k]); err != nil {
				snapErrs++
			}
		}
		p.pub = &publisher{clk: p.clk, sub: cfg.SubBuckets, widthMs: 100}
		tuning := cfg.Tuning
		tuning.SubBuckets = cfg.SubBuckets
		ec := enforcer.Config{
			Tuning:    tuning,
			Rules:     rules.Static(rc),
			Site:      name,
			Snapshot:  p.snap,
			Publisher: p.pub,
			Clock:     p.clk,
		}
		if cfg.split {
			ec.Snapshot, ec.DefaultShare = nil, 1/float64(cfg.DCs*cfg.Procs)
		}
		p.lim, err = enforcer.New(ec)
		if err != nil {
			return err
		}
		dc.procs = append(dc.procs, p)
		return nil
	}
	for i := range sites {
		s := &dcSite{name: siteName(i), compacted: map[string][]byte{}}
		if s.agg, err = aggregator.NewMemory(aggregator.Config{SubBuckets: cfg.SubBuckets, MaxKeys: 10 * (clients + 10),
			Logger: slog.New(slog.DiscardHandler)}); err != nil {
			return 0, 0, nil, err
		}
		sites[i] = s
		for k := range cfg.Procs {
			if err := startProc(s, i, procName(s.name, k, cfg.Procs)); err != nil {
				return 0, 0, nil, err
			}
		}
	}
	// hits[i][j]: data center i's records on their way to data center j's aggregator;
	// counts[j]: data center j's emissions on their way to its processes.
	// hbs carries the site heartbeats apart from the hits when they cross cuts (the
	// control runs); otherwise it is hits itself.
	hits, hbs := make([][]stream, cfg.DCs), make([][]stream, cfg.DCs)
	for i := range hits {
		hits[i], hbs[i] = make([]stream, cfg.DCs), make([]stream, cfg.DCs)
		if !cfg.heartbeatsCrossCuts {
			hbs[i] = hits[i]
		}
	}
	counts := make([]stream, cfg.DCs)
	// topicFrom is the hits topic data center j reads data center i's records from.
	topicFrom := func(i, j int) string {
		if i == j {
			return topics.DefaultHitsTopic
		}
		return topics.RemoteHitsTopic(sites[i].name, topics.DefaultHitsTopic)
	}
	localMs, wanMs, jitMs := cfg.Local.Milliseconds(), cfg.WAN.Milliseconds(), cfg.Jitter.Milliseconds()
	linkRng := rand.New(rand.NewPCG(seed^0x5bd1e995, 3))
	routeRng := rand.New(rand.NewPCG(seed^0x2545f491, 5))
	// The lag reports' jitter is drawn apart, so that the hits' is what it was without them.
	repRng := rand.New(rand.NewPCG(seed^0x68e31da4, 9))
	delayBy := func(rng *rand.Rand, i, j int, t int64, heartbeat bool) int64 {
		if i == j {
			return t + localMs
		}
		d := wanMs
		if jitMs > 0 {
			d += rng.Int64N(2*jitMs+1) - jitMs
		}
		at := t + localMs + d
		if heartbeat && cfg.heartbeatsCrossCuts {
			return at
		}
		for _, c := range cuts {
			if ((c.a == i && c.b == j) || (c.a == j && c.b == i)) && at >= c.from && t < c.to {
				at = max(at, c.to+d)
			}
		}
		return at
	}
	delay := func(i, j int, t int64, heartbeat bool) int64 { return delayBy(linkRng, i, j, t, heartbeat) }
	var (
		recs []pubRec
		out  enforcer.Result
	)
	// send publishes records of process p of data center i to every data center.
	send := func(i int, p *dcProc, t int64, recs []pubRec) {
		for _, r := range recs {
			h := topics.Hit{Key: r.key, Site: p.name, BucketStart: r.bucket, Window: r.window, Count: r.n, Denied: r.d}
			for j := range sites {
				hits[i][j].push(transit{at: delay(i, j, t, false), hit: h})
			}
		}
	}
	siteRecord := func(i int, p *dcProc, t int64, h topics.Hit) {
		for j := range sites {
			hbs[i][j].push(transit{at: delay(i, j, t, true), hit: h})
		}
	}
	next, nextChurn := 0, 0
	for t := int64(0); t < durMs; t++ {
		if t%1024 == 0 && ctx.Err() != nil {
			return 0, 0, nil, ctx.Err()
		}
		now := time.UnixMilli(startMs + t).UTC()
		clk.Set(now)
		// 0. Processes stop and start.
		for ; nextChurn < len(churn) && churn[nextChurn].t <= t; nextChurn++ {
			ev := churn[nextChurn]
			dc := sites[ev.dc]
			if ev.kind == churnStart {
				if err := startProc(dc, ev.dc, ev.proc); err != nil {
					return 0, 0, nil, err
				}
				continue
			}
			k := slices.IndexFunc(dc.procs, func(p *dcProc) bool { return p.name == ev.proc })
			if k < 0 {
				continue
			}
			p := dc.procs[k]
			dc.procs = slices.Delete(dc.procs, k, k+1)
			if ev.kind == churnLeave {
				// Close: everything pending is delivered, then a leave record.
				recs = p.pub.flush(math.MaxInt64, recs[:0])
				send(ev.dc, p, t, recs)
				siteRecord(ev.dc, p, t, topics.Hit{Key: topics.SiteLeaveKey, Site: p.name, BucketStart: p.clk.Now().UnixMilli(), Instance: p.instance})
			}
			// A crash loses what was pending and says nothing.
		}
		// 1. Producers: finished buckets every 50 ms of their own clock (so that a clock
		// off true time does not move the flushes against the buckets' ends), then site
		// heartbeats every 500 ms, stamped with the oldest bucket still held back.
		for i, s := range sites {
			for _, p := range s.procs {
				pms := p.clk.Now().UnixMilli()
				if pms%50 != 0 {
					continue
				}
				recs = p.pub.flush(pms, recs[:0])
				send(i, p, t, recs)
				if t-p.lastHB >= 500 {
					p.lastHB = t
					siteRecord(i, p, t, topics.Hit{Key: topics.SiteHeartbeatKey, Site: p.name, BucketStart: p.pub.watermark(pms), Instance: p.instance})
				}
			}
		}
		// 2. Every aggregator counts what has reached it, at its own clock.
		for j, s := range sites {
			now := now.Add(hc.agg[j])
			for i := range sites {
				if cfg.forge != nil {
					for _, h := range cfg.forge(t, i) {
						// Refused or not, a forgery is not the run's error.
						_ = s.agg.AddFrom(now, topicFrom(i, j), h)
					}
				}
				st := &hits[i][j]
				if cfg.heartbeatsCrossCuts {
					// Heartbeats first: they arrive as if nothing were cut.
					hb := &hbs[i][j]
					k := 0
					for ; k < len(hb.q) && hb.q[k].at <= t; k++ {
						if err := s.agg.AddFrom(now, topicFrom(i, j), hb.q[k].hit); err != nil {
							aggErrs++
						}
					}
					hb.q = hb.q[k:]
				}
				k := 0
				for ; k < len(st.q) && st.q[k].at <= t; k++ {
					var err error
					if rep := st.q[k].rep; rep != nil {
						err = s.agg.AddLagReport(now, topicFrom(i, j), rep)
					} else {
						err = s.agg.AddFrom(now, topicFrom(i, j), st.q[k].hit)
					}
					if err != nil {
						aggErrs++
					}
				}
				st.q = st.q[k:]
			}
			// Its lag report when due, to its hits topic and on to the other data centers
			// like the hits.
			if now.UnixMilli()%100 == 0 {
				rep := s.agg.LagReport(now)
				for i := range sites {
					if rep == nil {
						break
					}
					if i != j {
						hits[j][i].push(transit{at: delayBy(repRng, j, i, t, false), rep: rep})
					}
				}
			}
			// 3. It emits every 100 ms of its clock, to its own data center's processes.
			if now.UnixMilli()%100 == 0 {
				for _, e := range s.agg.Emit(now) {
					counts[j].push(transit{at: t + localMs, em: e})
				}
			}
			st := &counts[j]
			k := 0
			for ; k < len(st.q) && st.q[k].at <= t; k++ {
				em := st.q[k].em
				if em.Value == nil {
					delete(s.compacted, string(em.Key))
				} else {
					s.compacted[string(em.Key)] = em.Value
				}
				for _, p := range s.procs {
					if err := p.snap.Apply(em.Key, em.Value); err != nil {
						snapErrs++
					}
				}
			}
			st.q = st.q[k:]
		}
		// What each process's snapshot shows of its clock, every second after the warm-up.
		if t%1000 == 0 && t >= cfg.Window.Milliseconds() {
			for _, s := range sites {
				for _, p := range s.procs {
					c := &clocks[clockOf[p.name]]
					ahead, behind := p.snap.ClockSkew()
					c.Ahead, c.Behind = max(c.Ahead, ahead), max(c.Behind, behind)
					if p.snap.CheckClock() != nil {
						c.Unready++
					}
					c.Checks++
				}
			}
			// And every aggregator's estimate of each process's clock against its own.
			for j, s := range sites {
				for i, o := range sites {
					for _, p := range o.procs {
						est, ok := s.agg.ClockOffset(topicFrom(i, j), p.name)
						if !ok {
							continue
						}
						c := &clocks[clockOf[p.name]]
						c.Estimated++
						d := est - min(max(hc.agg[j]-p.clk.off+cfg.Local, -clock.MaxAhead), clock.MaxAhead)
						c.EstimateErr = max(c.EstimateErr, d, -d)
					}
				}
			}
		}
		// 4. Requests, in arrival order, each to one of its data center's serving processes.
		for ; next < len(arrivals) && arrivals[next].t == t; next++ {
			a := arrivals[next]
			procs := sites[a.site].procs
			if len(procs) == 0 {
				decided(a, false) // nothing serves the data center: refused
				continue
			}
			p := procs[0]
			if len(procs) > 1 {
				p = procs[routeRng.IntN(len(procs))]
			}
			p.lim.DecideInto(ctx, reqs[a.client], &out)
			decided(a, out.Code == enforcer.CodeOK)
		}
	}
	return aggErrs, snapErrs, clocks, nil
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
