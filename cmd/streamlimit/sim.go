package main

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/streamlimit/streamlimit/enforcer"
	"github.com/streamlimit/streamlimit/internal/sim"
	"github.com/streamlimit/streamlimit/window"
)

// simFlags are the settings of the sim command and its compare subcommand.
type simFlags struct {
	scenarios, sites, lags, loads string
	limit                         int64
	window                        time.Duration
	windows, warmup, light        int
	seed                          uint64
	subBuckets                    int
	tuning                        enforcer.Tuning
	parallel                      int

	svg                string
	plotScenario       string
	plotSites          int
	plotLag            time.Duration
	plotLoad           float64
	plotFrom, plotSpan time.Duration
	compareScenario    string
	compareLoad        float64
	compareSubBuckets  int
}

func (f *simFlags) registerCommon(cmd *cobra.Command) {
	fs := cmd.Flags()
	fs.Int64Var(&f.limit, "limit", 100, "the heavy client's global limit, requests per window")
	fs.DurationVar(&f.window, "window", 10*time.Second, "the rule's sliding window")
	fs.IntVar(&f.windows, "windows", 10, "measured windows per run")
	fs.IntVar(&f.warmup, "warmup", 1, "warm-up windows per run, excluded from the statistics")
	fs.Uint64Var(&f.seed, "seed", 1, "traffic seed (same flags and seed give the same output)")
}

func newSimCmd() *cobra.Command {
	var f simFlags
	cmd := &cobra.Command{
		Use:   "sim",
		Short: "Accuracy simulation: the real enforcer and aggregator on virtual time",
		Long: `sim drives the real enforcer (one Limiter per site, in-memory snapshot, in-process
site counter) and the real aggregator counting (aggregator.Memory) through an in-memory
transport with a configurable pipeline lag, on a virtual clock with seeded traffic, and
compares the decisions with an exact global sliding-window log. No Kafka is needed and the
output is byte-identical for identical flags.

Lag is the transport's delay, split evenly: half from the producers to the aggregator, half
from the aggregator to every site's snapshot. The producers' 100 ms coalescing buckets
(flushed every 50 ms) and the aggregator's 100 ms emission period add to it.

Columns: max/limit and mean/limit are the admitted requests in sliding windows lying wholly
after the warm-up; cold start max is the same over windows overlapping the warm-up (the key's
first contact); admitted/ideal compares the admitted total with what an exact global log would
have admitted of the same requests; a request is wrongly allowed when it was admitted although
the admitted count in (t−W, t] was already at the limit, wrongly denied when it was denied
although that count was below it (percent of the steady-state requests).`,
		Example: `  streamlimit sim --svg docs/accuracy.svg
  streamlimit sim --scenarios bursty --sites 3 --lags 200ms --loads 2,5,10
  streamlimit sim compare`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return f.run(cmd) },
	}
	f.registerCommon(cmd)
	fs := cmd.Flags()
	fs.StringVar(&f.scenarios, "scenarios", "uniform,bursty,skewed,ramp", "comma-separated scenarios (uniform, bursty, skewed, ramp)")
	fs.StringVar(&f.sites, "sites", "1,3,5", "comma-separated site counts")
	fs.StringVar(&f.lags, "lags", "0,50ms,200ms,1s", "comma-separated pipeline lags")
	fs.StringVar(&f.loads, "loads", "2,10", "comma-separated offered loads, as multiples of the limit")
	fs.IntVar(&f.light, "light", 0, "light clients (0.3 × limit each) that should never be denied")
	fs.IntVar(&f.subBuckets, "sub-buckets", window.DefaultSubBuckets, "sub-buckets per window of the aggregator and the site counters")
	registerTuning(fs, &f.tuning)
	fs.IntVar(&f.parallel, "parallel", runtime.GOMAXPROCS(0), "runs simulated at once (the output does not depend on it)")
	fs.StringVar(&f.svg, "svg", "", "write the plot of one traced run to this SVG file")
	fs.StringVar(&f.plotScenario, "plot-scenario", "uniform", "scenario of the plotted run")
	fs.IntVar(&f.plotSites, "plot-sites", 3, "sites of the plotted run")
	fs.DurationVar(&f.plotLag, "plot-lag", 200*time.Millisecond, "lag of the plotted run")
	fs.Float64Var(&f.plotLoad, "plot-load", 5, "load of the plotted run")
	fs.DurationVar(&f.plotFrom, "plot-from", -1, "start of the plotted range, since the run's start (default: end of the warm-up)")
	fs.DurationVar(&f.plotSpan, "plot-span", 0, "length of the plotted range (default: 3 windows)")
	cmd.AddCommand(newSimCompareCmd(), newSimDCCmd(), newSimTiersCmd(), newSimWANCmd())
	return cmd
}

func (f *simFlags) base() sim.Config {
	return sim.Config{Limit: f.limit, Window: f.window, Windows: f.windows, Warmup: warmupFlag(f.warmup),
		Light: f.light, Seed: f.seed, Tuning: f.tuning, SubBuckets: f.subBuckets}
}

// warmupFlag maps the flag's 0 ("no warm-up") to the Config's negative value.
func warmupFlag(n int) int {
	if n == 0 {
		return -1
	}
	return n
}

func (f *simFlags) run(cmd *cobra.Command) error {
	m := sim.Matrix{Base: f.base()}
	for _, s := range splitList(f.scenarios) {
		sc, err := sim.ParseScenario(s)
		if err != nil {
			return err
		}
		m.Scenarios = append(m.Scenarios, sc)
	}
	for _, s := range splitList(f.sites) {
		var n int
		if _, err := fmt.Sscan(s, &n); err != nil {
			return fmt.Errorf("--sites: %q: %w", s, err)
		}
		m.Sites = append(m.Sites, n)
	}
	for _, s := range splitList(f.lags) {
		if s == "0" {
			m.Lags = append(m.Lags, 0)
			continue
		}
		d, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("--lags: %w", err)
		}
		m.Lags = append(m.Lags, d)
	}
	for _, s := range splitList(f.loads) {
		var v float64
		if _, err := fmt.Sscan(s, &v); err != nil {
			return fmt.Errorf("--loads: %q: %w", s, err)
		}
		m.Loads = append(m.Loads, v)
	}
	ctx := cmd.Context()
	results, err := sim.RunMatrix(ctx, m, f.parallel)
	if err != nil {
		return err
	}
	if err := sim.WriteTable(cmd.OutOrStdout(), results); err != nil {
		return err
	}
	if f.svg == "" {
		return nil
	}
	sc, err := sim.ParseScenario(f.plotScenario)
	if err != nil {
		return err
	}
	pc := f.base()
	pc.Scenario, pc.Sites, pc.Lag, pc.Load, pc.Trace = sc, f.plotSites, f.plotLag, f.plotLoad, true
	r, err := sim.Run(ctx, pc)
	if err != nil {
		return err
	}
	opts := sim.PlotOptions{SpanMs: f.plotSpan.Milliseconds(), FromMs: f.plotFrom.Milliseconds()}
	if f.plotFrom < 0 {
		opts.FromMs = int64(max(pc.Warmup, 0)) * pc.Window.Milliseconds()
		if pc.Warmup < 0 {
			opts.FromMs = 0
		}
	}
	if opts.SpanMs <= 0 {
		opts.SpanMs = 3 * pc.Window.Milliseconds()
	}
	var b strings.Builder
	if err := sim.WriteSVG(&b, r, opts); err != nil {
		return err
	}
	if err := os.WriteFile(f.svg, []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("sim: --svg: %w", err)
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "wrote %s (%s, %d sites, %v lag, %g× load)\n", f.svg, sc, pc.Sites, pc.Lag, pc.Load)
	return nil
}

func newSimCompareCmd() *cobra.Command {
	var f simFlags
	cmd := &cobra.Command{
		Use:   "compare",
		Short: "Counting rules compared: fixed window vs sliding window counter vs sub-windows vs exact log",
		Long: `compare runs the same traffic of one client against one local limiter counted four
ways, each by the project's real code: fixed window and the two-window sliding window counter
(enforcer/algo), sub-window counts (the aggregator's rule, through the enforcer's site
counter) and the exact sliding-window log (enforcer/algo). Columns are defined as for sim.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			sc, err := sim.ParseScenario(f.compareScenario)
			if err != nil {
				return err
			}
			res, err := sim.Compare(cmd.Context(), sim.CompareConfig{Scenario: sc, Load: f.compareLoad, Limit: f.limit,
				Window: f.window, Windows: f.windows, Warmup: warmupFlag(f.warmup), SubBuckets: f.compareSubBuckets, Seed: f.seed})
			if err != nil {
				return err
			}
			return sim.WriteCompareTable(cmd.OutOrStdout(), res)
		},
	}
	f.registerCommon(cmd)
	fs := cmd.Flags()
	fs.StringVar(&f.compareScenario, "scenario", "bursty", "traffic shape (uniform, bursty, skewed, ramp)")
	fs.Float64Var(&f.compareLoad, "load", 5, "offered load, as a multiple of the limit")
	fs.IntVar(&f.compareSubBuckets, "sub-buckets", window.DefaultSubBuckets, "sub-buckets per window of the sub-window counter")
	return cmd
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// registerTuning adds the enforcer's global-share settings under test.
func registerTuning(fs *pflag.FlagSet, t *enforcer.Tuning) {
	fs.Float64Var(&t.MinShare, "min-share", 0, "enforcer MinShare (0: the enforcer's default)")
	fs.DurationVar(&t.SiteStaleAfter, "site-stale-after", 0, "enforcer SiteStaleAfter (0: the enforcer's default)")
	fs.Float64Var(&t.ShareDamping, "share-damping", 0, "enforcer ShareDamping (0: the enforcer's default, negative: off)")
	fs.Float64Var(&t.DemandPrior, "demand-prior", 0, "enforcer DemandPrior (0: the enforcer's default, negative: off)")
	fs.DurationVar(&t.CrashHold, "crash-hold", 0, "enforcer CrashHold (0: the enforcer's default, negative: none)")
	fs.DurationVar(&t.ReserveMargin, "reserve-margin", 0, "enforcer ReserveMargin (0: the enforcer's default, negative: none)")
	fs.DurationVar(&t.ServingSpan, "serving-span", 0, "enforcer ServingSpan (0: the enforcer's default, negative: every data center that served the key in the window counts)")
}

func newSimDCCmd() *cobra.Command {
	var (
		base      sim.DCConfig
		scenarios string
		parallel  int
		sweep     bool
		sweepSpan bool
		margins   []time.Duration
		spans     []time.Duration
		sweepSVG  string
	)
	cmd := &cobra.Command{
		Use:   "dc",
		Short: "Data-center simulation: many clients, several data centers, WAN links, cuts",
		Long: `dc simulates several data centers, each with its own aggregator (counting every data
center's hits, its own a local hop after they are made and the others' a WAN link later) and
one enforcer, joined by links with latency, jitter and cuts, under many clients at once, on
a virtual clock. Every client's decisions are compared with an exact global sliding-window
log on the same requests (the oracle).

Scenarios: mix (10 000 clients, Zipf activity, 1% abusive at 2–10×, 1% migrating every
30 s), migrating (clients moving data center every 10 s), failover (all clients move when
their data center fails), partition (one data center cut off for 60 s, then healed), jitter
(the mix with ±100 ms link jitter), bursty (one client at 10×, on and off).

Columns: max/limit is the most of one client's requests admitted in any sliding window,
across all data centers, over its limit; admitted/oracle compares the admitted total with
the oracle's; false 429s are requests denied that the oracle admitted, in percent of all
requests ("behind": only those where the client had been admitted fewer in the window than
the oracle had; "under limit": of clients below their limit; "migrating": of moving
clients); move is the time from a moved client's first request at its new data center to
its first admission there. Each target is then reported as met or MISSED.`,
		Example: `  streamlimit sim dc
  streamlimit sim dc --scenarios partition,migrating --wan 40ms --jitter 10ms
  streamlimit sim dc --sweep-reserve-margin --svg docs/accuracy-reserve.svg
  streamlimit sim dc --sweep-serving-span --svg docs/accuracy-serving.svg`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var scs []sim.DCScenario
			for _, s := range splitList(scenarios) {
				scs = append(scs, sim.DCScenario(s))
			}
			if sweep && sweepSpan {
				return errors.New("sim dc: --sweep-reserve-margin and --sweep-serving-span: one sweep at a time")
			}
			if sweep || sweepSpan {
				setting, values := sim.SweepReserveMargin, margins
				if sweepSpan {
					setting, values = sim.SweepServingSpan, spans
				}
				pts, err := sim.Sweep(cmd.Context(), base, scs, setting, values, parallel)
				if err != nil {
					return err
				}
				if err := sim.WriteSweepTable(cmd.OutOrStdout(), pts); err != nil {
					return err
				}
				if sweepSVG == "" {
					return nil
				}
				var b strings.Builder
				if err := sim.WriteSweepSVG(&b, pts); err != nil {
					return err
				}
				if err := os.WriteFile(sweepSVG, []byte(b.String()), 0o644); err != nil {
					return fmt.Errorf("sim dc: --svg: %w", err)
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "wrote %s\n", sweepSVG)
				return nil
			}
			rs, err := sim.RunDCScenarios(cmd.Context(), base, scs, parallel)
			if err != nil {
				return err
			}
			return sim.WriteDCTable(cmd.OutOrStdout(), rs, sim.DefaultDCTargets())
		},
	}
	fs := cmd.Flags()
	var all []string
	for _, s := range sim.DCScenarios() {
		all = append(all, string(s))
	}
	fs.StringVar(&scenarios, "scenarios", strings.Join(all, ","), "comma-separated scenarios")
	fs.IntVar(&base.DCs, "dcs", 3, "data centers")
	fs.DurationVar(&base.WAN, "wan", 0, "one-way latency between data centers (0: 150ms, about 200 ms of pipeline lag)")
	fs.DurationVar(&base.Jitter, "jitter", 0, "link jitter, ± (0: 20ms; 100ms for jitter)")
	fs.IntVar(&base.Clients, "clients", 0, "clients (0: the scenario's default)")
	fs.IntVar(&base.Procs, "procs", 0, "enforcer processes per data center, each a site of its own (0: 1, or 6 for the churn scenarios)")
	fs.BoolVar(&base.NoChurn, "no-churn", false, "run the churn scenarios without starting or stopping any process (their control)")
	fs.DurationVar(&base.ClockSkew, "clock-skew", 0, "put every host's clock (each data center's aggregator and enforcer processes) off true time by offsets spread evenly within ± this, in an order drawn from the seed")
	fs.DurationSliceVar(&base.ClockOffsets, "clock-offsets", nil, "offsets added to each data center's enforcer processes' clocks, in data center order (e.g. 0,0,2s: the third site 2 s ahead)")
	fs.IntVar(&base.Windows, "windows", 0, "measured windows after one warm-up window (0: the scenario's default)")
	fs.Int64Var(&base.Limit, "limit", 100, "every client's global limit, requests per window")
	fs.DurationVar(&base.Window, "window", 10*time.Second, "the rule's sliding window")
	fs.Uint64Var(&base.Seed, "seed", 1, "traffic seed (same flags and seed give the same output)")
	fs.StringVar(&base.Algorithm, "algorithm", "", "the global limit's algorithm: sliding_window (default), token_bucket or gcra")
	fs.Int64Var(&base.Burst, "burst", 0, "bucket size of token_bucket and gcra; the oracle is then at most burst in any burst/rate")
	registerTuning(fs, &base.Tuning)
	fs.BoolVar(&sweep, "sweep-reserve-margin", false, "run every scenario at every --margins and print max/limit against the false 429s of clients under their limit and of migrating clients (the frontier the enforcer's --reserve-margin moves along)")
	fs.DurationSliceVar(&margins, "margins", sim.DefaultSweepMargins(), "reserve margins --sweep-reserve-margin tries (negative: none)")
	fs.BoolVar(&sweepSpan, "sweep-serving-span", false, "run every scenario at every --spans and print max/limit against the false 429s of clients under their limit and of migrating clients (the frontier the enforcer's --serving-span moves along)")
	fs.DurationSliceVar(&spans, "spans", sim.DefaultSweepSpans(), "serving spans --sweep-serving-span tries (negative: off)")
	fs.StringVar(&sweepSVG, "svg", "", "with --sweep-reserve-margin or --sweep-serving-span, also plot the frontier to this SVG file")
	fs.IntVar(&parallel, "parallel", runtime.GOMAXPROCS(0), "runs simulated at once (the output does not depend on it)")
	return cmd
}

func newSimTiersCmd() *cobra.Command {
	var (
		c   sim.TiersConfig
		svg string
	)
	cmd := &cobra.Command{
		Use:   "tiers",
		Short: "Pools, priorities and elastic limits under a load ramping past the capacity",
		Long: `tiers simulates clients of two priorities (seven in ten paid, the rest free) sharing
one pool, a global capacity over three data centers, each client with an elastic limit
(its base, stretching to its elastic maximum while the pool is below the threshold), under a
load that ramps linearly from --from to --to times the capacity. It runs the same data
centers as sim dc and prints, per third of the ramp: the most admitted in any window over
the capacity (all clients, and free ones), each tier's admitted over offered, and the
requests admitted beyond a client's base (the elastic room given).`,
		Example: `  streamlimit sim tiers
  streamlimit sim tiers --to 3 --svg docs/accuracy-tiers.svg`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			r, err := sim.RunTiers(cmd.Context(), c)
			if err != nil {
				return err
			}
			if err := sim.WriteTiersTable(cmd.OutOrStdout(), r); err != nil {
				return err
			}
			if svg == "" {
				return nil
			}
			var b strings.Builder
			if err := sim.WriteTiersSVG(&b, r); err != nil {
				return err
			}
			if err := os.WriteFile(svg, []byte(b.String()), 0o644); err != nil {
				return fmt.Errorf("sim tiers: --svg: %w", err)
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "wrote %s\n", svg)
			return nil
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&svg, "svg", "", "also write the run over time to this SVG file")
	d := sim.DefaultTiersConfig()
	fs.IntVar(&c.Clients, "clients", d.Clients, "clients")
	fs.Int64Var(&c.Capacity, "capacity", d.Capacity, "the pool's capacity per window")
	fs.Float64Var(&c.From, "from", d.From, "offered load at the start, × capacity")
	fs.Float64Var(&c.To, "to", d.To, "offered load at the end, × capacity")
	fs.IntVar(&c.FreeFill, "free-fill", d.FreeFill, "percent of the pool free requests may fill")
	fs.Uint64Var(&c.Seed, "seed", 1, "traffic seed (same flags and seed give the same output)")
	registerTuning(fs, &c.Links.Tuning)
	return cmd
}

func newSimWANCmd() *cobra.Command {
	var c sim.WANConfig
	cmd := &cobra.Command{
		Use:   "wan",
		Short: "The multi-cluster end-to-end test's clients and timeline, simulated",
		Long: `wan runs, on the simulator, the clients and timeline of the end-to-end test that runs two
Kafka clusters joined by MirrorMaker 2 (docs/multidc.md): a steady client at 3× its limit
over both data centers, a migrating one at 1.5× and a lighter one at 0.8× switching every
8 s, four at 0.6× failing over at 20 s, both links cut from 35 s to 60 s. It prints the
test's table (per client and phase: over, under, false 429s against an exact global log)
so that the two can be compared line by line.`,
		Example: `  streamlimit sim wan
  streamlimit sim wan --wan 300ms`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			rows, err := sim.RunWAN(cmd.Context(), c)
			if err != nil {
				return err
			}
			return sim.WriteWANTable(cmd.OutOrStdout(), rows)
		},
	}
	fs := cmd.Flags()
	fs.DurationVar(&c.Links.WAN, "wan", 0, "one-way latency between the data centers, replication included (0: 40ms)")
	fs.DurationVar(&c.Links.Jitter, "jitter", 0, "link jitter, ± (0: 10ms)")
	registerTuning(fs, &c.Links.Tuning)
	return cmd
}
