package sim

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
)

// DCScenario names the traffic and faults of a data-center run (RunDC).
type DCScenario string

// The data-center scenarios. Every client has the same global limit (DCConfig.Limit per
// Window) on its own key; loads are multiples of it.
const (
	// DCMix is a realistic mix: Clients (default 10 000) with Zipf-distributed activity,
	// most far under their limit, some bursty (a few requests at once, as a page load
	// makes), 20% spread over the data centers and the rest at a home one; 1% abusive at 2
	// to 10× their limit (half spread, half at home); 1% migrating to the next data center
	// every 30 s.
	DCMix DCScenario = "mix"
	// DCJitter is DCMix (default 2 000 clients) with a link jitter of ±100 ms.
	DCJitter DCScenario = "jitter"
	// DCMigrating: clients (default 200) at 0.3 to 0.9× their limit, and a tenth of them
	// abusive at 3×, each moving to the next data center every 10 s at its own phase.
	DCMigrating DCScenario = "migrating"
	// DCFailover: clients (default 300) at 0.2 to 3× their limit, all at the first data
	// center until it fails two windows into the measurement, then all at the second.
	DCFailover DCScenario = "failover"
	// DCPartition: clients (default 200), half spread over the data centers at 2 to 5× their
	// limit, half at home at 0.5×; the first data center's links are cut for 60 s one
	// window into the measurement, then healed.
	DCPartition DCScenario = "partition"
	// DCBursty: one client at 10× its limit, on and off (ON ~ Exp(1 s) at 4× the average,
	// OFF ~ Exp(3 s)), spread over the data centers, as the classic bursty scenario.
	DCBursty DCScenario = "bursty"
	// DCSkewedCut: clients (default 100) at 5× their limit, each with 98% of its requests
	// at one of the first two data centers and 2% at the other; the first data center's
	// links are cut for 20 s one window into the measurement. Each side of the cut should
	// still admit its part of every client's limit, together the whole.
	DCSkewedCut DCScenario = "skewed-cut"

	// The churn scenarios: the mix (default 2 000 clients) on data centers of six enforcer
	// processes each (DCConfig.Procs), each a site of its own counting in process, among
	// which a data center's requests are spread.

	// DCRolling restarts every process of every data center, one at a time every 10 s
	// (staggered across data centers): it stops cleanly and starts again under its name 2 s
	// later, its in-process count lost.
	DCRolling DCScenario = "rolling"
	// DCAutoscale adds a process to every data center and removes the oldest, alternately
	// every 10 s: sites join under new names and leave cleanly.
	DCAutoscale DCScenario = "autoscale"
	// DCCrash stops two processes of every data center without a word (10 s and 30 s into
	// the measurement): their pending hits are lost and they send no leave record.
	DCCrash DCScenario = "crash"
	// DCLeave is DCCrash with clean stops.
	DCLeave DCScenario = "leave"
	// DCRename stops two processes of every data center cleanly and starts each again 2 s
	// later under a new site name.
	DCRename DCScenario = "rename"
)

// churns reports whether the scenario starts and stops processes.
func (s DCScenario) churns() bool {
	switch s {
	case DCRolling, DCAutoscale, DCCrash, DCLeave, DCRename:
		return true
	}
	return false
}

// DCScenarios returns every data-center scenario, in table order.
func DCScenarios() []DCScenario {
	return []DCScenario{DCMix, DCMigrating, DCFailover, DCPartition, DCSkewedCut, DCJitter, DCBursty,
		DCRolling, DCAutoscale, DCCrash, DCLeave, DCRename}
}

// clientKind says how a client behaves, for the per-kind figures.
type clientKind uint8

const (
	kindNormal clientKind = iota
	kindAbusive
	kindMigrating
)

type dcClient struct {
	name string
	kind clientKind
	load float64 // multiple of the limit per window, on average
}

// dcArrival is one request: at t ms since the start, of client, at site.
type dcArrival struct {
	t      int64
	client int
	site   int
	// moved is set on the first request of a migrating client after it moved: the
	// accounting measures from there how soon the new site admits it.
	moved bool
}

// dcPlan is a run's clients, requests and faults.
type dcPlan struct {
	clients  []dcClient
	arrivals []dcArrival
	cuts     []cut
	churn    []churnEvent // in time order
	// phases are the named intervals (ms since the start) the figures are also given for.
	phases []phase
}

type phase struct {
	name     string
	from, to int64
}

// placement returns the site of a client's request at t.
type placement func(r *rand.Rand, t int64) int

// skewed places a request at site a with probability pa, else at b.
func skewed(a, b int, pa float64) placement {
	return func(r *rand.Rand, _ int64) int {
		if r.Float64() < pa {
			return a
		}
		return b
	}
}

func home(s int) placement { return func(*rand.Rand, int64) int { return s } }

func spread(n int) placement { return func(r *rand.Rand, _ int64) int { return r.IntN(n) } }

// migrate moves from home to the next site every period, at phase offset.
func migrate(homeSite, n int, period, offset int64) placement {
	return func(_ *rand.Rand, t int64) int { return (homeSite + int((t+offset)/period)) % n }
}

// dcLoad builds cfg's plan over [0, durMs).
func dcLoad(rng *rand.Rand, cfg DCConfig, durMs int64) dcPlan {
	var p dcPlan
	wMs := cfg.Window.Milliseconds()
	warm := wMs
	perMs := float64(cfg.Limit) / float64(wMs) // one limit per window, per ms
	n := cfg.DCs
	type gen struct {
		place  placement
		bursty bool
		onOff  bool
	}
	var gens []gen
	add := func(kind clientKind, load float64, g gen) {
		p.clients = append(p.clients, dcClient{name: fmt.Sprintf("c%d", len(p.clients)), kind: kind, load: load})
		gens = append(gens, g)
	}
	clients := func(def int) int {
		if cfg.Clients > 0 {
			return cfg.Clients
		}
		return def
	}
	switch sc := cfg.Scenario; {
	case sc == DCMix || sc == DCJitter || sc.churns():
		total := clients(map[DCScenario]int{DCMix: 10_000}[cfg.Scenario])
		if total == 0 {
			total = clients(2_000)
		}
		abusive := max(total/100, 1)
		migrating := max(total/100, 1)
		for i := range total - abusive - migrating {
			load := 0.8 * math.Pow(float64(i+1), -0.7)
			g := gen{place: home(rng.IntN(n)), bursty: rng.IntN(10) < 3}
			if rng.IntN(5) == 0 {
				g.place = spread(n)
			}
			add(kindNormal, load, g)
		}
		for i := range abusive {
			g := gen{place: home(rng.IntN(n))}
			if i%2 == 0 {
				g.place = spread(n)
			}
			add(kindAbusive, 2+8*rng.Float64(), g)
		}
		for range migrating {
			add(kindMigrating, 0.2+0.6*rng.Float64(), gen{place: migrate(rng.IntN(n), n, 30_000, rng.Int64N(30_000)), bursty: true})
		}
	case sc == DCMigrating:
		total := clients(200)
		for i := range total {
			load := 0.3 + 0.6*rng.Float64()
			if i%10 == 0 {
				load = 3
			}
			add(kindMigrating, load, gen{place: migrate(rng.IntN(n), n, 10_000, rng.Int64N(10_000))})
		}
	case sc == DCFailover:
		total := clients(300)
		fail := warm + 2*wMs
		for i := range total {
			load := 0.2 + 0.8*rng.Float64()
			kind := kindNormal
			if i%10 == 0 {
				load, kind = 1+2*rng.Float64(), kindAbusive
			}
			add(kind, load, gen{place: func(_ *rand.Rand, t int64) int {
				if t < fail {
					return 0
				}
				return 1
			}})
		}
		p.phases = append(p.phases, phase{"after the failover", fail, durMs})
	case sc == DCPartition:
		total := clients(200)
		for i := range total {
			if i%2 == 0 {
				add(kindAbusive, 2+3*rng.Float64(), gen{place: spread(n)})
			} else {
				add(kindNormal, 0.5, gen{place: home(rng.IntN(n))})
			}
		}
		from := warm + wMs
		to := from + 60_000
		for j := 1; j < n; j++ {
			p.cuts = append(p.cuts, cut{a: 0, b: j, from: from, to: to})
		}
		p.phases = append(p.phases, phase{"during the cut", from, to}, phase{"after healing", to + wMs, durMs})
	case sc == DCSkewedCut:
		total := clients(100)
		for i := range total {
			a, b := 0, 1
			if i%2 == 1 {
				a, b = 1, 0
			}
			add(kindAbusive, 5, gen{place: skewed(a, b, 0.98)})
		}
		from := warm + wMs
		to := from + 20_000
		for j := 1; j < n; j++ {
			p.cuts = append(p.cuts, cut{a: 0, b: j, from: from, to: to})
		}
		p.phases = append(p.phases, phase{"during the cut", from, to}, phase{"after healing", to + wMs, durMs})
	case sc == DCBursty:
		add(kindAbusive, 10, gen{place: spread(n), onOff: true})
	}
	p.churn = churnPlan(cfg, warm)
	// Arrivals: each client a Poisson process at its load (bursty clients in bursts of 1 to
	// 5 requests; on/off clients at 4× their load during ON periods).
	for c, g := range gens {
		rate := p.clients[c].load * perMs
		r := rand.New(rand.NewPCG(rng.Uint64(), uint64(c)))
		var last int64 = -1
		t := 0.0
		on, switchAt := true, 0.0
		if g.onOff {
			switchAt = r.ExpFloat64() * 1000
		}
		for {
			rt := rate
			if g.onOff {
				for t >= switchAt {
					on = !on
					if on {
						switchAt += r.ExpFloat64() * 1000
					} else {
						switchAt += r.ExpFloat64() * 3000
					}
				}
				if !on {
					t = switchAt
					continue
				}
				rt = 4 * rate
			}
			burst := 1
			if g.bursty {
				burst = 1 + r.IntN(5)
			}
			t += r.ExpFloat64() / rt * float64(burst)
			ms := int64(t)
			if ms >= durMs {
				break
			}
			s := g.place(r, ms)
			moved := p.clients[c].kind == kindMigrating && last >= 0 && s != p.arrivals[last].site
			for k := range burst {
				p.arrivals = append(p.arrivals, dcArrival{t: min(ms+int64(k)*20, durMs-1), client: c, site: s, moved: moved && k == 0})
			}
			last = int64(len(p.arrivals) - 1)
		}
	}
	slices.SortStableFunc(p.arrivals, func(a, b dcArrival) int {
		switch {
		case a.t < b.t:
			return -1
		case a.t > b.t:
			return 1
		}
		return 0
	})
	return p
}

// churnPlan is the scenario's starts and stops of processes, in time order; warm is the end
// of the warm-up (ms).
func churnPlan(cfg DCConfig, warm int64) []churnEvent {
	if cfg.NoChurn {
		return nil
	}
	var ev []churnEvent
	name := func(d, k int) string { return procName(siteName(d), k, cfg.Procs) }
	switch cfg.Scenario {
	case DCRolling:
		for d := range cfg.DCs {
			for k := range cfg.Procs {
				at := warm + int64(k)*10_000 + int64(d)*3_000
				ev = append(ev, churnEvent{t: at, dc: d, proc: name(d, k), kind: churnLeave},
					churnEvent{t: at + 2_000, dc: d, proc: name(d, k), kind: churnStart})
			}
		}
	case DCAutoscale:
		for d := range cfg.DCs {
			added, oldest := cfg.Procs, 0
			for m := int64(0); m < int64(cfg.Windows)*cfg.Window.Milliseconds(); m += 20_000 {
				ev = append(ev, churnEvent{t: warm + m + 5_000 + int64(d)*1_000, dc: d, proc: name(d, added), kind: churnStart},
					churnEvent{t: warm + m + 15_000 + int64(d)*1_000, dc: d, proc: name(d, oldest), kind: churnLeave})
				added++
				oldest++
			}
		}
	case DCCrash, DCLeave:
		kind := churnCrash
		if cfg.Scenario == DCLeave {
			kind = churnLeave
		}
		for d := range cfg.DCs {
			ev = append(ev, churnEvent{t: warm + 10_000 + int64(d)*1_000, dc: d, proc: name(d, 0), kind: kind},
				churnEvent{t: warm + 30_000 + int64(d)*1_000, dc: d, proc: name(d, 1), kind: kind})
		}
	case DCRename:
		for d := range cfg.DCs {
			for i, at := range []int64{warm + 10_000, warm + 30_000} {
				at += int64(d) * 1_000
				ev = append(ev, churnEvent{t: at, dc: d, proc: name(d, i), kind: churnLeave},
					churnEvent{t: at + 2_000, dc: d, proc: name(d, i) + "-renamed", kind: churnStart})
			}
		}
	}
	slices.SortStableFunc(ev, func(a, b churnEvent) int { return int(a.t - b.t) })
	return ev
}
