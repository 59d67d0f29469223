package rlqs

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/protobuf/proto"

	"github.com/streamlimit/streamlimit/aggregator"
	"github.com/streamlimit/streamlimit/clock"
	"github.com/streamlimit/streamlimit/enforcer"
	"github.com/streamlimit/streamlimit/enforcer/rules"
	"github.com/streamlimit/streamlimit/enforcer/snapshot"
	"github.com/streamlimit/streamlimit/internal/envoyfilter"
	"github.com/streamlimit/streamlimit/topics"
	"github.com/streamlimit/streamlimit/window"
)

// simConfig is one run of the RLQS simulation: data centers, each one site with its own
// enforcer, RLQS server and aggregator, joined by links; simulated Envoys at each site
// deciding every request locally on the server's assignments; everything on a virtual
// clock in 1 ms steps, deterministic for a seed. The producer (100 ms buckets, flushed
// every 50 ms, site heartbeats every 500 ms), the links (5 ms local hop, WAN one way) and
// the aggregators' emission (every 100 ms) are modelled as in the accuracy simulator
// (streamlimit sim dc); the enforcer, its snapshot, the aggregator's counting, the RLQS
// server and the Envoy model are the real code.
type simConfig struct {
	DCs, EnvoysPerDC int
	Limit            int64
	Window           time.Duration
	Windows          int           // measured after one warm-up window
	Interval         time.Duration // the Envoys' report timer; 0: Envoy's (envoyfilter.ReportInterval)
	WAN              time.Duration
	RTT              time.Duration // Envoy ↔ RLQS server, round trip
	HeavyLoad        float64       // the heavy client's rate, multiples of Limit per Window
	Lights           int           // light clients, each at its home Envoy
	LightLoad        float64       // each light client's rate, multiples of Limit per Window
	PerUnit          bool          // assign requests_per_time_unit (Envoys enforcing it)
	// Under1 is the load of a client behind one Envoy, Under2 of a client spread over
	// every Envoy, multiples of Limit per Window (0: none); each has its own key.
	Under1, Under2 float64
	// CutEvery cuts every Envoy's stream this often (each at its own phase), as a server
	// restart or a load balancer would; the Envoy starts another at its next report.
	CutEvery time.Duration
	// EmptyStart runs the revision of Envoy's token bucket that starts a bucket empty
	// unless the host has been up longer than max_tokens ÷ fill rate, on hosts booted
	// Boot after the run starts (negative: before it; far ahead: every new bucket starts
	// empty).
	EmptyStart bool
	Boot       time.Duration
	Seed       uint64
}

// interval is the Envoys' report timer.
func (c simConfig) interval() time.Duration {
	if c.Interval > 0 {
		return c.Interval
	}
	return envoyfilter.ReportInterval
}

func (c simConfig) rules() string {
	return fmt.Sprintf("domain: sim\ndescriptors:\n  - key: user\n    rate_limit: {window: %dms, requests_per_unit: %d}\n", c.Window.Milliseconds(), c.Limit)
}

// simResult is what a run measured.
type simResult struct {
	heavy       []int64 // the heavy client's admission times, ms since the start
	heavyReqs   int
	lightReqs   int
	lightDenied int
	// under: the under-limit clients' requests and denials, after the first window (as
	// the heavy client's admissions are measured) and over the whole run, and the
	// denials an exact sliding-window log of the limit would have made.
	under      [2]simUnder
	responses  int
	reports    int
	dropped    int // reports lost with a cut stream
	expired    int // assignments that expired at an Envoy
	cuts       int
	maxOrphans int // holders reserved on closed streams, at most, at any Sweep
}

type simUnder struct {
	reqs, denied, allReqs, allDenied, exact int
}

// rate returns the denied part of the requests after the first window.
func (u simUnder) rate() float64 { return float64(u.denied) / float64(max(u.reqs, 1)) }

type simHit struct {
	at  int64
	hit topics.Hit
}

type simEmission struct {
	at int64
	em aggregator.Emission
}

// simPublisher is the producer's coalescing: one record per key, window and 100 ms
// bucket, handed over once the bucket has ended.
type simPublisher struct {
	clk     clock.Clock
	pending []topics.Hit
}

func (p *simPublisher) Hit(key string, w time.Duration, n int)    { p.add(key, w, int64(n), 0) }
func (p *simPublisher) Denied(key string, w time.Duration, n int) { p.add(key, w, 0, int64(n)) }

func (p *simPublisher) add(key string, w time.Duration, n, d int64) {
	ms := p.clk.Now().UnixMilli()
	b := ms - ms%100
	if sub := window.Width(w, 0); 100%sub != 0 && sub%100 != 0 {
		b = max(b, ms-ms%sub)
	}
	for i := range p.pending {
		h := &p.pending[i]
		if h.Key == key && h.Window == w.Milliseconds() && h.BucketStart == b {
			h.Count += n
			h.Denied += d
			return
		}
	}
	p.pending = append(p.pending, topics.Hit{Key: key, BucketStart: b, Window: w.Milliseconds(), Count: n, Denied: d})
}

func (p *simPublisher) flush(nowMs int64) (out []topics.Hit, watermark int64) {
	keep := p.pending[:0]
	watermark = nowMs
	for _, h := range p.pending {
		if h.BucketStart+100 <= nowMs {
			out = append(out, h)
		} else {
			keep = append(keep, h)
			watermark = min(watermark, h.BucketStart)
		}
	}
	p.pending = keep
	return out, watermark
}

type simEnvoy struct {
	f        *envoyfilter.Filter
	sess     *session // the open stream's; nil when there is none
	phase    int64
	cutPhase int64
}

// simMsg is a report on its way to a stream's session, or a response on its way back;
// either is lost when the stream is cut before it arrives.
type simMsg struct {
	at   int64
	env  int
	sess *session
	rep  *rlqsv3.RateLimitQuotaUsageReports
	resp *rlqsv3.RateLimitQuotaResponse
}

// runSim runs c and returns what it measured.
func runSim(tb testing.TB, c simConfig) simResult {
	tb.Helper()
	cfg, err := rules.Parse("sim.yaml", []byte(c.rules()))
	if err != nil {
		tb.Fatal(err)
	}
	start := time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)
	startMs := start.UnixMilli()
	clk := clock.NewFake(start)
	ctx := context.Background()
	type site struct {
		name   string
		snap   *snapshot.Snapshot
		agg    *aggregator.Memory
		pub    *simPublisher
		srv    *Server
		lastHB int64
	}
	sites := make([]*site, c.DCs)
	rng := rand.New(rand.NewPCG(c.Seed, 99))
	var envoys []*simEnvoy
	for i := range sites {
		s := &site{name: fmt.Sprintf("dc%d", i), pub: &simPublisher{clk: clk}, lastHB: -1 << 40}
		if s.snap, err = snapshot.NewMemory(snapshot.Config{Site: s.name, Clock: clk}); err != nil {
			tb.Fatal(err)
		}
		if s.agg, err = aggregator.NewMemory(aggregator.Config{}); err != nil {
			tb.Fatal(err)
		}
		lim, err := enforcer.New(enforcer.Config{Rules: rules.Static(cfg), Site: s.name, Snapshot: s.snap, Publisher: s.pub, Clock: clk})
		if err != nil {
			tb.Fatal(err)
		}
		opts := Options{Clock: clk}
		if c.PerUnit {
			opts.Strategy = RequestsPerTimeUnit
		}
		if s.srv, err = NewServer(lim, opts); err != nil {
			tb.Fatal(err)
		}
		sites[i] = s
		for range c.EnvoysPerDC {
			fo := envoyfilter.Options{Domain: "sim", Interval: c.Interval, EnforceRequestsPerTimeUnit: c.PerUnit,
				PrefillNeedsUptime: c.EmptyStart, Boot: start.Add(c.Boot)}
			e := &simEnvoy{f: envoyfilter.New(fo), phase: rng.Int64N(c.interval().Milliseconds())}
			if c.CutEvery > 0 {
				e.cutPhase = rng.Int64N(c.CutEvery.Milliseconds())
			}
			envoys = append(envoys, e)
		}
	}
	siteOf := func(e int) int { return e / c.EnvoysPerDC }
	hits := make([][][]simHit, c.DCs) // hits[from][to]
	for i := range hits {
		hits[i] = make([][]simHit, c.DCs)
	}
	counts := make([][]simEmission, c.DCs)
	var msgs []simMsg
	wMs, ivMs := c.Window.Milliseconds(), c.interval().Milliseconds()
	durMs := wMs * int64(1+c.Windows)
	half := max(c.RTT.Milliseconds()/2, 1)

	// Arrivals: the heavy client spread evenly over every Envoy, each light client at its
	// home Envoy, the under-limit clients at one Envoy and over all; Poisson processes.
	type arrival struct {
		t      int64
		env    int
		client int // 0 heavy, 1.. light, under1, under2
	}
	var arrivals []arrival
	perMs := float64(c.Limit) / float64(wMs)
	poisson := func(rate float64, client int, place func() int) {
		for x := rng.ExpFloat64() / rate; x < float64(durMs); x += rng.ExpFloat64() / rate {
			arrivals = append(arrivals, arrival{t: int64(x), env: place(), client: client})
		}
	}
	poisson(c.HeavyLoad*perMs, 0, func() int { return rng.IntN(len(envoys)) })
	for i := range c.Lights {
		home := rng.IntN(len(envoys))
		poisson(c.LightLoad*perMs, i+1, func() int { return home })
	}
	under1, under2 := c.Lights+1, c.Lights+2
	if c.Under1 > 0 {
		home := rng.IntN(len(envoys))
		poisson(c.Under1*perMs, under1, func() int { return home })
	}
	if c.Under2 > 0 {
		poisson(c.Under2*perMs, under2, func() int { return rng.IntN(len(envoys)) })
	}
	var exact [2][]int64 // the under-limit clients' admissions by an exact sliding-window log
	slices.SortStableFunc(arrivals, func(a, b arrival) int { return int(a.t - b.t) })

	var res simResult
	s := settings(c.interval())
	next := 0
	for t := int64(0); t < durMs; t++ {
		now := time.UnixMilli(startMs + t).UTC()
		clk.Set(now)
		if t%50 == 0 {
			for i, st := range sites {
				out, wm := st.pub.flush(startMs + t)
				if t-st.lastHB >= 500 {
					st.lastHB = t
					out = append(out, topics.Hit{Key: topics.SiteHeartbeatKey, BucketStart: wm})
				}
				for _, h := range out {
					h.Site = st.name
					for j := range sites {
						d := int64(5)
						if i != j {
							d += c.WAN.Milliseconds()
						}
						hits[i][j] = append(hits[i][j], simHit{at: t + d, hit: h})
					}
				}
			}
		}
		for j, st := range sites {
			for i := range sites {
				k := 0
				for ; k < len(hits[i][j]) && hits[i][j][k].at <= t; k++ {
					topic := topics.DefaultHitsTopic // its own data center's
					if i != j {
						topic = topics.RemoteHitsTopic(sites[i].name, topics.DefaultHitsTopic)
					}
					if err := st.agg.AddFrom(now, topic, hits[i][j][k].hit); err != nil {
						tb.Fatalf("aggregator %s: %v", st.name, err)
					}
				}
				hits[i][j] = hits[i][j][k:]
			}
			if t%100 == 0 {
				for _, e := range st.agg.Emit(now) {
					counts[j] = append(counts[j], simEmission{at: t + 5, em: e})
				}
			}
			k := 0
			for ; k < len(counts[j]) && counts[j][k].at <= t; k++ {
				if err := st.snap.Apply(counts[j][k].em.Key, counts[j][k].em.Value); err != nil {
					tb.Fatalf("snapshot %s: %v", st.name, err)
				}
			}
			counts[j] = counts[j][k:]
		}
		// Messages due: reports reach their server, responses their Envoy.
		k := 0
		for ; k < len(msgs) && msgs[k].at <= t; k++ {
			m := msgs[k]
			e := envoys[m.env]
			if m.sess != e.sess {
				if m.rep != nil {
					res.dropped++
				}
				continue // the stream was cut on its way
			}
			if m.rep != nil {
				res.reports++
				resp, err := e.sess.handle(ctx, now, m.rep.GetDomain(), usagesOf(m.rep, nil))
				if err != nil {
					tb.Fatal(err)
				}
				if resp != nil {
					var r rlqsv3.RateLimitQuotaResponse
					if err := proto.Unmarshal(resp, &r); err != nil {
						tb.Fatal(err)
					}
					msgs = append(msgs, simMsg{at: t + half, env: m.env, sess: m.sess, resp: &r})
				}
			} else {
				e.f.Apply(now, m.resp)
				res.responses++
			}
		}
		msgs = msgs[k:]
		slices.SortStableFunc(msgs, func(a, b simMsg) int { return int(a.at - b.at) })
		if t%1000 == 0 {
			for _, st := range sites {
				st.srv.Sweep(now)
				n := 0
				st.srv.requests.each(func(r *request) { r.mu.Lock(); n += len(r.orphans); r.mu.Unlock() })
				res.maxOrphans = max(res.maxOrphans, n)
			}
		}
		for i, e := range envoys {
			if c.CutEvery > 0 && e.sess != nil && (t-e.cutPhase)%c.CutEvery.Milliseconds() == 0 {
				e.sess.close(now) // the server's side ends; the Envoy sees the stream closed
				e.sess = nil
				res.cuts++
			}
			if e.f.Started() && (t-e.phase)%ivMs == 0 {
				// The report timer: reports built (counters reset), then the stream
				// started again when it was closed (global_client_impl.cc).
				r := e.f.Reports(now)
				if e.sess == nil {
					e.sess = sites[siteOf(i)].srv.newSession()
				}
				msgs = append(msgs, simMsg{at: t + half, env: i, sess: e.sess, rep: r})
			}
		}
		for ; next < len(arrivals) && arrivals[next].t == t; next++ {
			a := arrivals[next]
			id := map[string]string{"user": "heavy"}
			switch {
			case a.client == under1 || a.client == under2:
				id["user"] = fmt.Sprintf("under%d", a.client-c.Lights)
			case a.client > 0:
				id["user"] = fmt.Sprintf("light%d", a.client)
			}
			e := envoys[a.env]
			first := !e.f.Started()
			ok, initial := e.f.Decide(now, id, s)
			if initial != nil {
				// A new bucket's report goes out at once on the open stream; the first
				// bucket ever starts the stream; with none open, it is lost.
				if first && e.sess == nil {
					e.sess = sites[siteOf(a.env)].srv.newSession()
				}
				if e.sess != nil {
					msgs = append(msgs, simMsg{at: t + half, env: a.env, sess: e.sess, rep: initial})
				} else {
					res.dropped++
				}
			}
			switch {
			case a.client == 0:
				res.heavyReqs++
				if ok {
					res.heavy = append(res.heavy, t)
				}
			case a.client == under1 || a.client == under2:
				u := &res.under[a.client-under1]
				u.allReqs++
				if !ok {
					u.allDenied++
				}
				if t >= wMs {
					u.reqs++
					if !ok {
						u.denied++
					}
				}
				log := &exact[a.client-under1]
				if lo, _ := slices.BinarySearch(*log, t-wMs+1); int64(len(*log)-lo) < c.Limit {
					*log = append(*log, t)
				} else {
					u.exact++
				}
			default:
				res.lightReqs++
				if !ok {
					res.lightDenied++
				}
			}
		}
	}
	for _, e := range envoys {
		res.expired += e.f.Expired()
	}
	return res
}

// windowCounts returns the most and fewest admissions in a sliding window of w (ms) over
// the windows that start at or after from and end by to, checked at every admission and
// every instant an admission leaves.
func windowCounts(times []int64, w, from, to int64) (most, fewest int) {
	fewest = -1
	count := func(end int64) int {
		lo, _ := slices.BinarySearch(times, end-w+1)
		hi, _ := slices.BinarySearch(times, end+1)
		return hi - lo
	}
	for end := from + w; end <= to; end += 10 {
		n := count(end)
		most = max(most, n)
		if fewest < 0 || n < fewest {
			fewest = n
		}
	}
	return most, fewest
}

// simCase is one row of the accuracy table: a run and the bounds it is held to.
type simCase struct {
	name string
	mod  func(*simConfig)
	// most and least bound the heavy client's admissions in every window after the
	// first, multiples of the limit; under1 and under2 the under-limit clients' denied
	// part after the first window; lights the light clients' denials.
	most, least    float64
	under1, under2 float64
	lights         int
}

// simCases are the runs of TestSimAccuracy and of the table in docs/rlqs.md, at Envoy's
// cadence (a report every 5 s on a fixed timer, at random phases across Envoys) unless
// the name says otherwise: a limit of 1 200 per 10 s; a heavy client at 5× spread over
// every Envoy; an under-limit client at 0.8× behind one Envoy and another at 0.5× spread
// over all; 30 light clients at 2%, each at its home Envoy.
func simCases() (simConfig, []simCase) {
	base := simConfig{DCs: 1, EnvoysPerDC: 20, Limit: 1200, Window: 10 * time.Second, Windows: 5,
		WAN: 150 * time.Millisecond, RTT: 2 * time.Millisecond, HeavyLoad: 5, Lights: 30, LightLoad: 0.02,
		Under1: 0.8, Under2: 0.5, Seed: 1}
	three := func(c *simConfig) { c.DCs = 3 }
	cut := func(c *simConfig) { c.CutEvery = 7 * time.Second }
	empty := func(c *simConfig) { c.EmptyStart, c.Boot = true, -10*time.Second }
	both := func(fs ...func(*simConfig)) func(*simConfig) {
		return func(c *simConfig) {
			for _, f := range fs {
				f(c)
			}
		}
	}
	// The under-limit bounds hold what seed 1 reaches (a little above), against
	// regressions: the 1% aimed at is met in the rows of Envoy's cadence and deployment,
	// which TestSimAccuracySeeds runs over seeds 1–6; the other rows hold what is reached.
	return base, []simCase{
		{"1x20", func(*simConfig) {}, 1.05, 0.5, 0, 0, 0},
		{"3x20", three, 1.05, 0.5, 0.001, 0.002, 0},
		{"1x20-cut-7s", cut, 1.05, 0.5, 0, 0, 0},
		{"3x20-cut-7s", both(three, cut), 1.05, 0.5, 0.001, 0.0025, 0},
		// Envoy's revision of its token bucket on hosts up 10 s when the traffic starts.
		{"1x20-empty-start", empty, 1.05, 0.5, 0, 0, 0},
		{"3x20-empty-start", both(three, empty), 1.05, 0.5, 0.001, 0.002, 0},
		// Every new token bucket empty, as on a host up for less than max_tokens ÷
		// fill rate: not what a host that has been up a second sees.
		{"1x20-always-empty", func(c *simConfig) { c.EmptyStart, c.Boot = true, time.Hour }, 1.05, 0.5, 0.01, 0.03, 5},
		// A filter reporting every second, faster than Envoy's: an extra row.
		{"3x20-report-1s", both(three, func(c *simConfig) { c.Interval = time.Second }), 1.05, 0.6, 0.001, 0.001, 0},
		{"3x20-requests-per-time-unit", both(three, func(c *simConfig) { c.PerUnit = true }), 1.05, 0.3, 0.02, 0.12, 0},
		// One Envoy per data center: a data center's usage reaches the others in lumps,
		// a reporting period apart.
		{"3x1", both(three, func(c *simConfig) { c.EnvoysPerDC = 1 }), 1.25, 0.3, 0.02, 0.02, 0},
	}
}

// each calls f with every value t holds, under its shard's lock.
func (t *sharedTable[V, P]) each(f func(P)) {
	for i := range t.shards {
		t.shards[i].mu.Lock()
		for _, v := range t.shards[i].m {
			f(v)
		}
		t.shards[i].mu.Unlock()
	}
}
