package sim

import (
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/streamlimit/streamlimit/enforcer"
	"github.com/streamlimit/streamlimit/enforcer/rules"
	"github.com/streamlimit/streamlimit/internal/svgplot"
)

// TiersConfig is one run of the tiers simulation: many clients of two priorities sharing
// one pool (a global capacity) over several data centers, each client with an elastic
// limit, under a load that ramps from well under the capacity to well over it. Every zero
// field takes the default written in its comment.
type TiersConfig struct {
	// Links are the data centers and their links (DCs, WAN, Jitter, Local, Tuning and
	// SubBuckets are used). Defaults as for DCConfig.
	Links DCConfig
	// Clients is the number of clients, seven in ten paid, the rest free. Default 1000.
	Clients int
	// Capacity is the pool's limit per Window, half of what the clients' base limits add up to (a pool is overbooked: not every client is busy at once). Default 5 000 per 10s.
	Capacity int64
	Window   time.Duration
	// Base and ElasticMax are every client's limit per Window and what it may stretch to
	// while the pool is below Until percent full. Defaults 10, 30 and 50.
	Base, ElasticMax int64
	Until            int
	// FreeFill is the percentage of the pool free requests may fill. Default 80.
	FreeFill int
	// From and To are the offered load at the start and the end of the run, as multiples of
	// Capacity per Window; it ramps linearly between them. Defaults 0.2 and 1.5.
	From, To float64
	// Windows is the length of the run after one warm-up window at From. Default 12.
	Windows int
	// Seed seeds the traffic.
	Seed uint64
}

// DefaultTiersConfig returns the TiersConfig every field left zero stands for, so that a
// command can show the defaults without stating them again.
func DefaultTiersConfig() TiersConfig {
	c, err := TiersConfig{}.normalize()
	if err != nil {
		panic(fmt.Sprintf("sim: the tiers defaults do not normalize: %v", err)) // a bug here, not bad input
	}
	return c
}

func (c TiersConfig) normalize() (TiersConfig, error) {
	var err error
	c.Links.Scenario = DCMix // for its defaults only
	if c.Links, err = c.Links.normalize(); err != nil {
		return c, err
	}
	def(&c.Clients, 1000)
	def(&c.Until, 50)
	def(&c.FreeFill, 80)
	def(&c.Windows, 12)
	def(&c.Capacity, 5_000)
	def(&c.Window, 10*time.Second)
	def(&c.Base, 10)
	def(&c.ElasticMax, 30)
	def(&c.From, 0.2)
	def(&c.To, 1.5)
	if c.Clients < 2 || c.Capacity < 1 || c.Base < 1 || c.ElasticMax < c.Base || c.FreeFill < 1 || c.FreeFill > 100 ||
		c.Until < 0 || c.Until > 100 || c.From <= 0 || c.To <= 0 || c.Windows < 1 || c.Window < time.Second {
		return c, fmt.Errorf("sim: tiers config out of range: %+v", c)
	}
	return c, nil
}

// isFree tells a tiers run's free clients (three in ten) from its paid ones.
func isFree(client int) bool { return client%10 >= 7 }

// tiersRules is the rule set of a tiers run.
func tiersRules(c TiersConfig) (*rules.Config, error) {
	w := c.Window.Milliseconds()
	limit := func() string {
		return fmt.Sprintf("{window: %dms, requests_per_unit: %d, pool: all, elastic: {max: %d, until: %d}}", w, c.Base, c.ElasticMax, c.Until)
	}
	y := fmt.Sprintf(`domain: %s
pools:
  - name: all
    rate_limit: {window: %dms, requests_per_unit: %d}
    priorities: {paid: 100, free: %d}
descriptors:
  - key: tier
    value: paid
    priority: paid
    descriptors:
      - key: %s
        rate_limit: %s
  - key: tier
    value: free
    priority: free
    descriptors:
      - key: %s
        rate_limit: %s
`, domain, w, c.Capacity, c.FreeFill, descKey, limit(), descKey, limit())
	rc, err := rules.Parse("tiers.yaml", []byte(y))
	if err != nil {
		return nil, fmt.Errorf("sim: tiers rules: %w", err)
	}
	return rc, nil
}

// TierPhase is what one stretch of the ramp measured.
type TierPhase struct {
	// From and To are the offered load at the phase's ends, as multiples of the capacity.
	From, To float64
	// MaxRatio is the most admitted in any window ending in the phase (all clients) ÷ the
	// capacity.
	MaxRatio float64
	// Offered and Admitted per tier (0 paid, 1 free).
	Offered, Admitted [2]int64
	// AboveBase counts admitted requests a client made beyond its base limit in the
	// window: the elastic room it was given.
	AboveBase int64
	// FreeMax is the most free requests admitted in any window ending in the phase ÷ the
	// capacity.
	FreeMax float64
}

// TierPoint is a tiers run at one instant: the requests offered and admitted (paid, free)
// in the window ending then, as multiples of the capacity.
type TierPoint struct {
	T                   int64 // ms since the start
	Offered, Paid, Free float64
}

// TiersResult is a tiers run's phases, in ramp order.
type TiersResult struct {
	Config TiersConfig
	Phases []TierPhase
	// Series samples the run every 250 ms.
	Series []TierPoint
	// AggregatorErrors and SnapshotErrors count records refused; they should be zero.
	AggregatorErrors, SnapshotErrors int64
}

// RunTiers simulates c and returns what it measured. It is deterministic.
func RunTiers(ctx context.Context, c TiersConfig) (TiersResult, error) {
	c, err := c.normalize()
	if err != nil {
		return TiersResult{}, err
	}
	rc, err := tiersRules(c)
	if err != nil {
		return TiersResult{}, err
	}
	wMs := c.Window.Milliseconds()
	durMs := wMs * int64(1+c.Windows)
	seed := c.Seed*0x9e3779b97f4a7c15 + 0x7ee5
	rng := rand.New(rand.NewPCG(seed, seed>>7|1))
	// Clients: weights spread over an order of magnitude, so that some want more than
	// their base while others want little; a home data center each, most requests there.
	weights := make([]float64, c.Clients)
	homes := make([]int, c.Clients)
	total := 0.0
	reqs := make([]enforcer.Request, c.Clients)
	for i := range weights {
		weights[i] = math.Exp(rng.NormFloat64() * 0.6)
		total += weights[i]
		homes[i] = rng.IntN(c.Links.DCs)
		tier := "paid"
		if isFree(i) {
			tier = "free"
		}
		reqs[i] = enforcer.Request{Domain: domain, Descriptors: [][]rules.Entry{{{Key: "tier", Value: tier}, {Key: descKey, Value: fmt.Sprintf("c%d", i)}}}}
	}
	cum := make([]float64, c.Clients)
	acc := 0.0
	for i, w := range weights {
		acc += w / total
		cum[i] = acc
	}
	load := func(t int64) float64 { // offered, multiples of capacity per window
		if t < wMs {
			return c.From
		}
		return c.From + (c.To-c.From)*float64(t-wMs)/float64(durMs-wMs)
	}
	var arrivals []dcArrival
	for t := 0.0; ; {
		rate := load(int64(t)) * float64(c.Capacity) / float64(wMs) // per ms
		t += rng.ExpFloat64() / rate
		if int64(t) >= durMs {
			break
		}
		u := rng.Float64()
		k, lo, hi := 0, 0, c.Clients-1
		for lo < hi {
			mid := (lo + hi) / 2
			if cum[mid] < u {
				lo = mid + 1
			} else {
				hi = mid
			}
		}
		k = lo
		s := homes[k]
		if rng.Float64() < 0.3 {
			s = rng.IntN(c.Links.DCs)
		}
		arrivals = append(arrivals, dcArrival{t: int64(t), client: k, site: s})
	}
	// Phases: thirds of the measured ramp.
	res := TiersResult{Config: c}
	const nPhases = 3
	phaseOf := func(t int64) int {
		if t < wMs {
			return -1
		}
		return min(int((t-wMs)*nPhases/(durMs-wMs)), nPhases-1)
	}
	for i := range nPhases {
		a := wMs + (durMs-wMs)*int64(i)/nPhases
		b := wMs + (durMs-wMs)*int64(i+1)/nPhases
		res.Phases = append(res.Phases, TierPhase{From: load(a), To: load(b)})
	}
	var all, free, paid, offered slidingLog
	perClient := make([]slidingLog, c.Clients)
	nextSample := int64(0)
	capF := float64(c.Capacity)
	decided := func(a dcArrival, ok bool) {
		offered.t = append(offered.t, a.t)
		if a.t >= nextSample {
			res.Series = append(res.Series, TierPoint{T: a.t, Offered: float64(offered.count(a.t, wMs)) / capF,
				Paid: float64(paid.count(a.t, wMs)) / capF, Free: float64(free.count(a.t, wMs)) / capF})
			nextSample = a.t - a.t%250 + 250
		}
		p := phaseOf(a.t)
		tier := 0
		if isFree(a.client) {
			tier = 1
		}
		if p >= 0 {
			res.Phases[p].Offered[tier]++
		}
		if !ok {
			return
		}
		all.t = append(all.t, a.t)
		n := all.count(a.t, wMs)
		mine := &perClient[a.client]
		mine.t = append(mine.t, a.t)
		over := mine.count(a.t, wMs) > c.Base
		var nf int64
		if tier == 1 {
			free.t = append(free.t, a.t)
			nf = free.count(a.t, wMs)
		} else {
			paid.t = append(paid.t, a.t)
		}
		if p < 0 {
			return
		}
		ph := &res.Phases[p]
		ph.Admitted[tier]++
		ph.MaxRatio = max(ph.MaxRatio, float64(n)/float64(c.Capacity))
		ph.FreeMax = max(ph.FreeMax, float64(nf)/float64(c.Capacity))
		if over {
			ph.AboveBase++
		}
	}
	res.AggregatorErrors, res.SnapshotErrors, _, err = simulateDCs(ctx, c.Links, rc, seed, durMs, arrivals, nil, nil, reqs, c.Clients, decided)
	if err != nil {
		return TiersResult{}, err
	}
	return res, nil
}

// WriteTiersTable writes r as a Markdown table: per third of the ramp, the offered load,
// the most admitted in any window (all clients, and free clients) over the capacity, each
// tier's admitted ÷ offered, and the admitted requests beyond a client's base limit.
func WriteTiersTable(w io.Writer, r TiersResult) error {
	c := r.Config
	var b strings.Builder
	fmt.Fprintf(&b, "Pool %d per %v over %d data centers; %d clients (70%% paid, 30%% free at %d%% of the pool), base %d, elastic %d below %d%% full.\n\n",
		c.Capacity, c.Window, c.Links.DCs, c.Clients, c.FreeFill, c.Base, c.ElasticMax, c.Until)
	b.WriteString("| offered (× capacity) | max admitted/capacity | free max/capacity | paid admitted/offered | free admitted/offered | admitted beyond base |\n")
	b.WriteString("|---|---|---|---|---|---|\n")
	ratio := func(a, o int64) string {
		if o == 0 {
			return "–"
		}
		return fmt.Sprintf("%.3f", float64(a)/float64(o))
	}
	for _, p := range r.Phases {
		fmt.Fprintf(&b, "| %.2f–%.2f | %.3f | %.3f | %s | %s | %d |\n", p.From, p.To, p.MaxRatio, p.FreeMax,
			ratio(p.Admitted[0], p.Offered[0]), ratio(p.Admitted[1], p.Offered[1]), p.AboveBase)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteTiersSVG plots r over time: the requests offered and admitted (all, paid, free) in
// the window ending at each instant, over the capacity, with the capacity and free's part
// of it.
func WriteTiersSVG(w io.Writer, r TiersResult) error {
	c := r.Config
	const width, height, left, right, top, bottom = 960, 480, 70, 930, 70, 420
	var b strings.Builder
	svgplot.Header(&b, width, height, left, "Pools, priorities and elastic limits (streamlimit sim tiers)",
		fmt.Sprintf("%d clients over %d data centers, pool %d per %v, free may fill %d%%; offered load %.1f→%.1f× capacity",
			c.Clients, c.Links.DCs, c.Capacity, c.Window, c.FreeFill, c.From, c.To))
	ymax := 0.0
	for _, p := range r.Series {
		ymax = max(ymax, p.Offered)
	}
	step := svgplot.NiceStep(ymax / 5)
	ymax = math.Ceil(ymax/step) * step
	end := float64(c.Window.Milliseconds()) * float64(1+c.Windows) / 1000
	f := svgplot.Frame{Left: left, Right: right, Top: top, Bottom: bottom, X0: 0, X1: end, YMax: ymax, YStep: step,
		XTitle: "time (s)", YTitle: "requests in the window ÷ capacity", XLabel: func(x float64) string { return fmt.Sprintf("%gs", x) }}
	for x := 0.0; x <= end; x += svgplot.NiceStep(end / 10) {
		f.XTicks = append(f.XTicks, x)
	}
	f.Write(&b)
	series := func(v func(TierPoint) float64) [][2]float64 {
		pts := make([][2]float64, 0, len(r.Series))
		for _, p := range r.Series {
			pts = append(pts, [2]float64{float64(p.T) / 1000, v(p)})
		}
		return pts
	}
	f.Polyline(&b, "capacity", "#c00", 1.5, "6 4", [][2]float64{{0, 1}, {end, 1}})
	f.Polyline(&b, "free-fill", "#e69f00", 1.5, "6 4", [][2]float64{{0, float64(c.FreeFill) / 100}, {end, float64(c.FreeFill) / 100}})
	f.Polyline(&b, "offered", "#888", 1.5, "2 3", series(func(p TierPoint) float64 { return p.Offered }))
	f.Polyline(&b, "admitted", "black", 2, "", series(func(p TierPoint) float64 { return p.Paid + p.Free }))
	f.Polyline(&b, "paid", "#0072b2", 1.5, "", series(func(p TierPoint) float64 { return p.Paid }))
	f.Polyline(&b, "free", "#e69f00", 1.5, "", series(func(p TierPoint) float64 { return p.Free }))
	svgplot.Legend(&b, left+12, top+8, 260, []svgplot.LegendItem{
		{Label: "offered", Color: "#888", Dash: "2 3"},
		{Label: "admitted, all", Color: "black"},
		{Label: "admitted, paid", Color: "#0072b2"},
		{Label: "admitted, free", Color: "#e69f00"},
		{Label: "capacity", Color: "#c00", Dash: "6 4"},
		{Label: "free's part of the pool", Color: "#e69f00", Dash: "6 4"},
	})
	svgplot.Footer(&b)
	_, err := io.WriteString(w, b.String())
	return err
}
