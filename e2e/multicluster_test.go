package e2e_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/streamlimit/streamlimit/topics"
)

// mcProcsPerDC is how many enforcer processes each data center of TestMultiClusterWAN runs,
// each a site of its own ("eu-1", "eu-2") counting in process, behind the data center's
// load balancer.
const mcProcsPerDC = 2

// The timeline of TestMultiClusterWAN, from the start of the load. Every phase is a few
// windows of ruleWindow, so that the test stays within a few minutes.
const (
	// mcWarm is the load's first windows, not measured: the pipeline's settling (the
	// brokers' code paths of a first load compiled, the first counts of every key) and the
	// first window's over-admission.
	mcWarm = 12 * time.Second
	// The rolling restart: from mcRestartFirst on, one enforcer process every
	// mcRestartEvery is stopped with SIGTERM and started again under its name
	// mcRestartDown later.
	mcRestartFirst = mcWarm + time.Second
	mcRestartEvery = 4 * time.Second
	mcRestartDown  = 2 * time.Second
	// mcFailoverAt is when every client of the failover group moves from eu to us.
	mcFailoverAt = 24 * time.Second
	// mcCrashAt is when one of us's processes is killed with SIGKILL; it is started again
	// at mcCrashRestart.
	mcCrashAt      = 41 * time.Second
	mcCrashRestart = mcCrashAt + 12*time.Second
	// mcCutAt and mcHealAt bound the cut of eu from both other data centers.
	mcCutAt  = 60 * time.Second
	mcHealAt = mcCutAt + 20*time.Second
	// mcEnd ends the load.
	mcEnd = mcHealAt + 15*time.Second
	// mcMigrateEvery is how often the migrating clients move to the next data center.
	mcMigrateEvery = 8 * time.Second
)

// The bounds of TestMultiClusterWAN. Each is the project's target where the real topology
// meets it at a load average of about 10 on two cores; where it does not, the test asserts
// the figure it reaches there, with room, so that it cannot regress, and docs/multidc.md
// says why the target is missed.
const (
	// mcOver bounds over≥ (admissions surely in one window ÷ the limit) of the clients
	// above their limits outside the cut, mcOverCut in every window that overlaps it:
	// the targets, met (0.93–1.00).
	mcOver    = 1.02
	mcOverCut = 1.05
	// mcSkewOverCutReached is the figure asserted for the 98/2 clients in the windows that
	// overlap the cut, whose target is mcOverCut: 0.96–1.07 reached across runs (the
	// simulator's skewed-cut scenario gives 1.05, docs/accuracy.md).
	mcSkewOverCutReached = 1.10
	// mcUnderOneDC bounds under (admitted ÷ what an exact global limit admits) during the
	// cut of the clients at one data center all through it: the target, met (1.000).
	mcUnderOneDC = 0.95
	// mcSkewTarget is the target of what both sides of the cut admit together of a 98/2
	// client, as under; mcSkewReached the figure asserted (0.88–0.92 reached: as much as
	// outside the cut, see docs/multidc.md), and mcSkewOver its upper bound, met.
	mcSkewTarget  = 0.95
	mcSkewReached = 0.85
	mcSkewOver    = 1.05
	// mcTargetUnder is the target of under for every other client and phase;
	// mcUnderReached the figure asserted outside the cut (0.80–1.00 reached: a crashed
	// site's share stays reserved for enforcer.Defaults().CrashHold, a restarted process
	// refuses for a moment, several sites share a client less tightly than one), and
	// mcMoverReached in the cut for the clients that move during it (0.29–0.53 reached: the
	// worst case of a partition, each side keeping the other's share of a client that left
	// it).
	mcTargetUnder  = 0.90
	mcUnderReached = 0.75
	mcMoverReached = 0.20
	// mcMoverCrashReached is the figure asserted for the clients that move during the
	// crash (0.65–0.72 reached): a client that arrives at a data center whose other process
	// was just killed meets that process's share still reserved for it, which fades over
	// enforcer.Defaults().CrashHold.
	mcMoverCrashReached = 0.60
	// mcTargetFalse429 is the target share of false 429s, outside the cut, of a client
	// under its limit (every 429 it gets is false); mcFalse429Reached the figure asserted
	// (up to 3.8% reached), and mcFalse429Restarts during the rolling restart and for the
	// client that moves every 8 s (up to 16.3% reached: each move costs a few requests, and
	// more while the pipeline lags).
	mcTargetFalse429   = 0.01
	mcFalse429Reached  = 0.05
	mcFalse429Restarts = 0.20
)

// mcClient is one client of the multi-cluster test: a user (its own counter) sending rate
// requests per second, the i-th of them at t to the data center dcAt(t, i).
type mcClient struct {
	name string
	rate float64
	dcAt func(t time.Duration, i int) int
	// over says that the client sends more than its limit, so that over-admission is
	// meaningful for it.
	over bool
	// oneDC says that the client stays at one data center all through the cut.
	oneDC bool
	// moves says that the client moves between data centers on its own schedule, the cut
	// notwithstanding.
	moves bool
	// skewed marks the 98/2 clients.
	skewed bool
}

// mcProc is one enforcer process of a data center.
type mcProc struct {
	*proc
	site string
	// live says that the data center's load balancer sends it requests.
	live atomic.Bool
	// fallbacks sums streamlimit_enforcer_fallback_decisions_total over its runs, as
	// scraped before each stop.
	fallbacks float64
	// stops counts its clean stops, each of which must log its leave.
	stops int
}

// mcDC is one data center of the test: its cluster and links, and its enforcer processes
// behind a round-robin load balancer.
type mcDC struct {
	*dc
	agg   *proc
	procs []*mcProc
	rr    atomic.Uint64
}

// pick returns the next process in rotation, nil when none is.
func (d *mcDC) pick() *mcProc {
	n := uint64(len(d.procs))
	start := d.rr.Add(1)
	for i := range n {
		if p := d.procs[(start+i)%n]; p.live.Load() {
			return p
		}
	}
	return nil
}

// TestMultiClusterWAN runs three data centers as in production: an independent Kafka
// cluster each, MirrorMaker 2 (from Kafka's jars, on deploy/mm2.properties generalised to
// three clusters) copying each one's hits to the others through links with 40 ms ± 10 ms of
// latency each way (one per pair of data centers), one aggregator process and one counts
// topic per data center, and two enforcer processes per data center (the built binary, each
// a site counting in process) behind a round-robin load balancer. Under one load it goes
// through the life of sites:
//
//   - a rolling restart: every enforcer process, one every 4 s, removed from its balancer,
//     stopped with SIGTERM (it writes its leave records) and started again under its name
//     2 s later;
//   - a crash: one of us's processes killed with SIGKILL, started again 12 s later;
//   - a cut: eu cut off from both other data centers for 20 s, then healed (a probe hit
//     must not cross between eu and us while cut, must cross between us and ap, and
//     crosses again once healed).
//
// Clients: one at 3× its limit round-robin over the three data centers, one at 1.5× and one
// at 0.8× moving to the next data center every 8 s, a failover group under its limits at eu
// that moves to us at 24 s, one under its limit at eu throughout, and two at 5× with 98% of
// their requests at one data center and 2% at another (eu/us and us/eu). Every admission is
// measured against an exact global sliding-window log on the same requests, per client and
// phase, and bounded (docs/multidc.md); no decision may be a fallback, as nothing is
// degraded (the cut is not: each data center's pipeline keeps running).
func TestMultiClusterWAN(t *testing.T) {
	begin := time.Now()
	binary := buildStreamlimitAsync(t)
	names := []string{"eu", "us", "ap"}
	base := startMirroredDCs(t, names...)
	dcs := startDCProcesses(t, binary(), base)
	t.Logf("FIGURE multicluster: %d clusters, MirrorMaker, aggregators and %d enforcer processes ready in %v",
		len(dcs), len(dcs)*mcProcsPerDC, time.Since(begin).Round(time.Second))
	eu, us := dcs[0], dcs[1]

	limitRate := ruleLimit / ruleWindow.Seconds()
	migrate := func(t time.Duration, _ int) int { return int(t/mcMigrateEvery) % len(dcs) }
	clients := []mcClient{
		{name: "steady", rate: 3 * limitRate, over: true, dcAt: func(_ time.Duration, i int) int { return i % len(dcs) }},
		{name: "migrating", rate: 1.5 * limitRate, over: true, moves: true, dcAt: migrate},
		{name: "mig-light", rate: 0.8 * limitRate, moves: true, dcAt: migrate},
		{name: "home-eu", rate: 0.6 * limitRate, oneDC: true, dcAt: func(time.Duration, int) int { return 0 }},
		{name: "skew-eu", rate: 5 * limitRate, over: true, skewed: true, dcAt: skewedAt(0, 1)},
		{name: "skew-us", rate: 5 * limitRate, over: true, skewed: true, dcAt: skewedAt(1, 0)},
	}
	for i := range 2 {
		clients = append(clients, mcClient{name: fmt.Sprintf("failover-%d", i), rate: 0.6 * limitRate, oneDC: true,
			dcAt: func(t time.Duration, _ int) int {
				if t < mcFailoverAt {
					return 0
				}
				return 1
			}})
	}

	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), mcEnd)
	defer cancel()
	var events sync.WaitGroup
	var lifeMu sync.Mutex
	var life []string // the lifecycle's figures, in order
	note := func(format string, args ...any) {
		lifeMu.Lock()
		life = append(life, fmt.Sprintf("%6.2fs  ", time.Since(start).Seconds())+fmt.Sprintf(format, args...))
		lifeMu.Unlock()
	}
	ages := &ageSampler{}
	events.Go(func() { ages.run(ctx, start, dcs) })
	events.Go(func() { rollingRestart(ctx, t, start, dcs, note) })
	events.Go(func() { crashOne(ctx, t, start, dcs, 1, 1, note) })
	events.Go(func() { cutOff(ctx, t, start, dcs, eu, note) })
	pool := newCheckPool()
	defer pool.close()
	rs := runClients(ctx, start, clients, func(client string, d int, sent time.Duration) result {
		r := result{client: client, node: d, sent: sent}
		p := dcs[d].pick()
		if p == nil {
			r.recv, r.err = time.Since(start), fmt.Errorf("no enforcer of %s in rotation", dcs[d].Name)
			return r
		}
		r.site = p.site
		r.status, r.admitted, r.fallback, r.err = pool.check(p.addr(), checkRequest(client))
		r.recv = time.Since(start)
		return r
	})
	events.Wait()
	// Once healed, the links carry hits again.
	waitCrossed(t, eu.dc, us.dc, 2*time.Minute)
	waitCrossed(t, us.dc, eu.dc, 2*time.Minute)

	// No decision was a fallback: the answers say so, and so do the enforcers' metrics
	// over all their runs.
	var fallbacks float64
	for _, d := range dcs {
		for _, p := range d.procs {
			v, err := scrapeFallbacks(p)
			if err != nil {
				t.Errorf("%s: %v", p.site, err)
			}
			fallbacks += p.fallbacks + v
		}
	}
	all := summarize(rs, 0, mcEnd)
	t.Logf("FIGURE multicluster: %d requests, %d transport errors, %d not answered as decided (200 or 429), %d answers and %.0f decisions (metrics) marked fallback, max RTT %v",
		all.requests, all.errors, all.non200, all.fallback, fallbacks, all.maxRTT)
	if all.fallback > 0 || fallbacks > 0 {
		t.Errorf("%d answers marked fallback, %.0f fallback decisions in the enforcers' metrics; nothing was degraded", all.fallback, fallbacks)
	}
	// A few connections reset on a machine too loaded to answer within seconds, or to
	// the killed process, are the machine's and the crash's; more, or an answer whose
	// status is not its decision's, are the enforcers'. Failed requests are left out of
	// every figure below.
	if all.non200 > 0 || all.errors > all.requests/100 {
		t.Errorf("%d requests failed and %d were not answered as decided (first error: %v)", all.errors, all.non200, all.firstErr)
	} else if all.errors > 0 {
		t.Logf("%d of %d requests failed (first error: %v), left out of the figures", all.errors, all.requests, all.firstErr)
	}
	t.Logf("FIGURE multicluster: the sites' lifecycle as the enforcers saw it\n%s", strings.Join(life, "\n"))
	checkPipeline(t, ages)

	phases := []mcPhase{
		{name: "rolling", from: mcWarm, to: mcCrashAt, over: mcOver},
		{name: "crash", from: mcCrashAt, to: mcCrashRestart + ruleWindow, over: mcOver},
		// Every window that overlaps the cut, up to one window after healing.
		{name: "cut", from: mcCutAt - ruleWindow, to: mcHealAt + ruleWindow, over: mcOverCut, cut: true},
		// The cut itself: requests and windows within it.
		{name: "in-cut", from: mcCutAt, to: mcHealAt, over: mcOverCut, cut: true},
		{name: "healed", from: mcHealAt + lagAllowance, to: mcEnd, over: mcOver},
	}
	var table []string
	var missed mcMissed
	table = append(table, fmt.Sprintf("%-11s %-7s %8s %8s %8s %7s %7s %7s %10s", "client", "phase", "requests", "admitted", "oracle", "over", "over≥", "under", "false 429"))
	for _, c := range clients {
		mine := clientResults(rs, c.name)
		oracle := oracleAdmits(mine, ruleLimit, ruleWindow)
		for _, p := range phases {
			f := p.measure(mine, oracle)
			table = append(table, fmt.Sprintf("%-11s %-7s %8d %8d %8d %7.3f %7.3f %7.3f %5d %4.1f%%",
				c.name, p.name, f.requests, f.admitted, f.oracle, f.over, f.overSure, f.under, f.false429, f.false429Pct()))
			checkMCFigures(t, c, p, f, &missed)
		}
	}
	logMigrations(t, clientResults(rs, "mig-light"), names)
	logSkewSplit(t, rs, clients, names)
	t.Logf("FIGURE multicluster: limit %d per %v; over = most admitted in a sliding window ÷ limit, admissions timed by their answer; over≥ = the same counting only admissions whose request and answer both lie in the window (a lower bound, whatever the round trip); under = admitted ÷ admitted by an exact global log; false 429 = denied where the exact log admits\n%s",
		ruleLimit, ruleWindow, strings.Join(table, "\n"))
	t.Logf("FIGURE multicluster: %d targets missed, each within the figure asserted (docs/multidc.md says why): %s", len(missed), strings.Join(missed, "; "))
}

// checkPipeline logs the site ages the enforcers saw in each stretch of the timeline, and
// fails the test when, outside the crash and the cut, live sites were taken as silent in more
// than a tenth of the samples: the figures then measure a pipeline too slow for
// topics.SiteSilentAfter, not the sites' lifecycle.
func checkPipeline(t *testing.T, ages *ageSampler) {
	t.Helper()
	var lines []string
	stretches := []struct {
		name     string
		from, to time.Duration
		quiet    bool // no site is silent by design
	}{
		{"warm-up", 0, mcWarm, false},
		{"rolling", mcWarm, mcCrashAt, true},
		{"crash", mcCrashAt, mcCrashRestart + topics.SiteSilentAfter, false},
		{"between", mcCrashRestart + topics.SiteSilentAfter, mcCutAt, true},
		{"cut", mcCutAt, mcHealAt + topics.SiteSilentAfter, false},
		{"healed", mcHealAt + topics.SiteSilentAfter, mcEnd, true},
	}
	var quietN, quietSilent float64
	for _, st := range stretches {
		p50, p90, most, silent, n := ages.summary(st.from, st.to)
		lines = append(lines, fmt.Sprintf("  %-8s [%3.0fs, %3.0fs): oldest live site's age p50 %.2fs p90 %.2fs max %.2fs; some site taken as silent in %3.0f%% of %d samples",
			st.name, st.from.Seconds(), st.to.Seconds(), p50, p90, most, 100*silent, n))
		if st.quiet {
			quietN += float64(n)
			quietSilent += silent * float64(n)
		}
	}
	t.Logf("FIGURE multicluster: the pipeline as the enforcers saw it (first process of each data center, every second; a site is taken as silent after %v)\n%s",
		topics.SiteSilentAfter, strings.Join(lines, "\n"))
	if quietN > 0 && quietSilent/quietN > 0.1 {
		t.Errorf("live sites were taken as silent in %.0f%% of the samples outside the crash and the cut: the pipeline lagged beyond %v (above), so the figures below measure a machine too loaded for its brokers, not the sites' lifecycle",
			100*quietSilent/quietN, topics.SiteSilentAfter)
	}
}

// logSkewSplit logs, for the 98/2 clients, what each data center admitted per window during
// the cut: each side keeps to its part of the limit, and together they admit about the limit.
func logSkewSplit(t *testing.T, rs []result, clients []mcClient, names []string) {
	t.Helper()
	windows := float64(mcHealAt-mcCutAt) / float64(ruleWindow)
	var lines []string
	for _, c := range clients {
		if !c.skewed {
			continue
		}
		per := make([]float64, len(names))
		reqs := make([]int, len(names))
		for _, r := range rs {
			if r.client == c.name && r.answered() && r.recv >= mcCutAt && r.recv < mcHealAt {
				reqs[r.node]++
				if r.admitted {
					per[r.node]++
				}
			}
		}
		var parts []string
		var sum float64
		for i, n := range names {
			if reqs[i] > 0 {
				parts = append(parts, fmt.Sprintf("%s %.1f (%d requests)", n, per[i]/windows, reqs[i]))
				sum += per[i]
			}
		}
		lines = append(lines, fmt.Sprintf("  %s: %s; together %.1f = %.3f × the limit", c.name, strings.Join(parts, ", "), sum/windows, sum/windows/ruleLimit))
	}
	t.Logf("FIGURE multicluster: the 98/2 clients' admissions per %v window during the cut, by data center\n%s", ruleWindow, strings.Join(lines, "\n"))
}

// mcMissed collects the targets a run misses, with the figures it reached, for the log.
type mcMissed []string

func (m *mcMissed) add(format string, args ...any) { *m = append(*m, fmt.Sprintf(format, args...)) }

// checkMCFigures asserts the bounds of one client in one phase, and notes in missed the
// targets it misses within the figures asserted.
func checkMCFigures(t *testing.T, c mcClient, p mcPhase, f mcFigures, missed *mcMissed) {
	t.Helper()
	overBound := p.over
	if p.cut && c.skewed {
		overBound = mcSkewOverCutReached
	}
	switch {
	case c.over && f.overSure > overBound:
		t.Errorf("%s, %s: %d admitted within the window ending at %.2fs, timed by request and answer = %.3f × the limit, above the bound %.2f",
			c.name, p.name, f.sureCount, f.sureAt.Seconds(), f.overSure, overBound)
	case c.over && f.overSure > p.over:
		missed.add("%s %s over≥ %.3f (target %.2f)", c.name, p.name, f.overSure, p.over)
	}
	under := fmt.Sprintf("%s, %s: admitted %d where an exact global limit admits %d (%.3f); %d false 429s",
		c.name, p.name, f.admitted, f.oracle, f.under, f.false429)
	target, bound := mcTargetUnder, mcUnderReached
	switch {
	case p.cut && c.oneDC:
		target, bound = mcUnderOneDC, mcUnderOneDC
	case p.cut && c.skewed:
		target, bound = mcSkewTarget, mcSkewReached
		if f.under > mcSkewOver {
			t.Errorf("%s, above the bound %.2f", under, mcSkewOver)
		}
	case p.cut && c.moves:
		bound = mcMoverReached
	case p.name == "crash" && c.moves:
		bound = mcMoverCrashReached
	case p.cut:
	}
	if f.under < bound {
		t.Errorf("%s, below the bound %.2f (target %.2f)", under, bound, target)
	} else if f.under < target {
		missed.add("%s %s under %.3f (target %.2f)", c.name, p.name, f.under, target)
	}
	if !c.over && !p.cut {
		bound := mcFalse429Reached
		if c.moves || p.name == "rolling" {
			bound = mcFalse429Restarts
		}
		switch pct := f.false429Pct() / 100; {
		case pct > bound:
			t.Errorf("%s, %s: %d false 429s of %d requests (%.1f%%), above the bound %.0f%% (target %.0f%%)",
				c.name, p.name, f.false429, f.requests, 100*pct, 100*bound, 100*mcTargetFalse429)
		case pct > mcTargetFalse429:
			missed.add("%s %s false 429s %.1f%% (target %.0f%%)", c.name, p.name, 100*pct, 100*mcTargetFalse429)
		}
	}
}

// skewedAt sends 49 of every 50 requests (98%) to data center major and the 50th to minor.
func skewedAt(major, minor int) func(time.Duration, int) int {
	return func(_ time.Duration, i int) int {
		if i%50 == 49 {
			return minor
		}
		return major
	}
}

// rollingRestart stops every enforcer process with SIGTERM, one every mcRestartEvery from
// mcRestartFirst on (the first of each data center, then the second), and starts it again
// under its name mcRestartDown later. Each must exit cleanly having logged its leave, and be
// taken as left by a process of its data center and one of another before it is back.
func rollingRestart(ctx context.Context, t *testing.T, start time.Time, dcs []*mcDC, note func(string, ...any)) {
	at := start.Add(mcRestartFirst)
	for k := range mcProcsPerDC {
		for i, d := range dcs {
			p := d.procs[k]
			if !sleepUntil(ctx, at) {
				return
			}
			stopAt := time.Now()
			if err := stopProc(p); err != nil {
				t.Error(err)
				return
			}
			note("%s stopped (SIGTERM) in %v", p.site, time.Since(stopAt).Round(time.Millisecond))
			// Taken as left, in its data center and through MirrorMaker in the next one.
			peer := d.procs[(k+1)%mcProcsPerDC]
			remote := dcs[(i+1)%len(dcs)].procs[k]
			for _, w := range []*mcProc{peer, remote} {
				if _, err := waitState(ctx, w, "left", 1, stopAt.Add(mcRestartDown)); err != nil {
					t.Errorf("%s stopped cleanly: %v", p.site, err)
				} else {
					note("  %s takes it as left %v after the SIGTERM", w.site, time.Since(stopAt).Round(time.Millisecond))
				}
			}
			if !sleepUntil(ctx, stopAt.Add(mcRestartDown)) {
				return
			}
			if err := startProc(p); err != nil {
				t.Error(err)
				return
			}
			note("%s started again, ready %v after the SIGTERM", p.site, time.Since(stopAt).Round(time.Millisecond))
			at = at.Add(mcRestartEvery)
		}
	}
}

// crashOne kills the k-th process of data center di with SIGKILL at mcCrashAt (after
// removing it from its balancer, as a health check would) and starts it again at
// mcCrashRestart. Its data center's other process and one of the next data center must take
// it as crashed.
func crashOne(ctx context.Context, t *testing.T, start time.Time, dcs []*mcDC, di, k int, note func(string, ...any)) {
	p := dcs[di].procs[k]
	if !sleepUntil(ctx, start.Add(mcCrashAt)) {
		return
	}
	p.live.Store(false)
	if v, err := scrapeFallbacks(p); err != nil {
		t.Errorf("%s: %v", p.site, err)
	} else {
		p.fallbacks += v
	}
	kill := time.Now()
	p.kill()
	note("%s killed (SIGKILL)", p.site)
	for _, w := range []*mcProc{dcs[di].procs[(k+1)%mcProcsPerDC], dcs[(di+1)%len(dcs)].procs[0]} {
		if _, err := waitState(ctx, w, "crashed", 1, start.Add(mcCrashRestart)); err != nil {
			t.Errorf("%s crashed: %v", p.site, err)
		} else {
			note("  %s takes it as crashed %v after the SIGKILL", w.site, time.Since(kill).Round(time.Millisecond))
		}
	}
	if !sleepUntil(ctx, start.Add(mcCrashRestart)) {
		return
	}
	if err := startProc(p); err != nil {
		t.Error(err)
		return
	}
	note("%s started again, ready %v after the SIGKILL", p.site, time.Since(kill).Round(time.Millisecond))
}

// cutOff cuts iso off from every other data center at mcCutAt and heals the links at
// mcHealAt. While cut, a hit must not cross between iso and another data center, must still
// cross between the others, and the enforcers must take the sites across the cut as cut.
func cutOff(ctx context.Context, t *testing.T, start time.Time, dcs []*mcDC, iso *mcDC, note func(string, ...any)) {
	if !sleepUntil(ctx, start.Add(mcCutAt)) {
		return
	}
	var others []*mcDC
	for _, d := range dcs {
		if d != iso {
			others = append(others, d)
			cutBetween(iso.dc, d.dc)
		}
	}
	cut := time.Now()
	note("%s cut off from %s and %s", iso.Name, others[0].Name, others[1].Name)
	var probes sync.WaitGroup
	probes.Go(func() {
		// The harness itself: the cut links carry nothing, the others still do.
		errs := make([]error, 4)
		var wg sync.WaitGroup
		wg.Go(func() { errs[0] = probeBlocked(iso.dc, others[0].dc, 5*time.Second) })
		wg.Go(func() { errs[1] = probeBlocked(others[0].dc, iso.dc, 5*time.Second) })
		wg.Go(func() { _, errs[2] = crossed(others[0].dc, others[1].dc, 10*time.Second) })
		wg.Go(func() { _, errs[3] = crossed(others[1].dc, others[0].dc, 10*time.Second) })
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Error(err)
		}
	})
	// Every process takes the sites across the cut as cut: eu's the other four, the
	// others eu's two.
	for _, d := range dcs {
		want := float64(mcProcsPerDC)
		if d == iso {
			want = float64(mcProcsPerDC * len(others))
		}
		p := d.procs[0]
		if _, err := waitState(ctx, p, "cut", want, cut.Add(8*time.Second)); err != nil {
			t.Errorf("%s cut off: %v", iso.Name, err)
		} else {
			note("  %s takes %.0f sites as cut %v after the cut", p.site, want, time.Since(cut).Round(time.Millisecond))
		}
	}
	probes.Wait()
	if !sleepUntil(ctx, start.Add(mcHealAt)) {
		return
	}
	for _, d := range others {
		healBetween(iso.dc, d.dc)
	}
	heal := time.Now()
	note("%s's links healed", iso.Name)
	all := float64(len(dcs) * mcProcsPerDC)
	for _, d := range dcs {
		p := d.procs[0]
		if _, err := waitState(ctx, p, "fresh", all, heal.Add(30*time.Second)); err != nil {
			t.Errorf("healed: %v", err)
		} else {
			note("  %s takes all %.0f sites as fresh %v after healing", p.site, all, time.Since(heal).Round(time.Millisecond))
		}
	}
}

// stopProc takes p out of its balancer, lets the requests sent to it finish, and stops it
// with SIGTERM; it must exit cleanly, having logged its leave.
func stopProc(p *mcProc) error {
	p.live.Store(false)
	time.Sleep(200 * time.Millisecond)
	v, err := scrapeFallbacks(p)
	if err != nil {
		return fmt.Errorf("%s: %w", p.site, err)
	}
	p.fallbacks += v
	if _, err := p.stop(30 * time.Second); err != nil {
		return err
	}
	p.stops++
	if n := strings.Count(p.out.String(), "producer: left"); n != p.stops {
		return fmt.Errorf("%s logged %d leaves in %d clean stops", p.site, n, p.stops)
	}
	return nil
}

// startProc starts p again and puts it back in its balancer once ready.
func startProc(p *mcProc) error {
	if err := p.start(); err != nil {
		return err
	}
	if err := p.waitReady(60 * time.Second); err != nil {
		return err
	}
	p.live.Store(true)
	return nil
}

// waitState polls p's streamlimit_enforcer_sites until it counts n sites in state (or, for
// "left", "crashed" and "cut", at least n), and returns how long that took; an error when
// deadline passes first.
func waitState(ctx context.Context, p *mcProc, state string, n float64, deadline time.Time) (time.Duration, error) {
	start := time.Now()
	var last float64
	for {
		if ms, err := p.metrics("streamlimit_enforcer_sites"); err == nil {
			last = metric(ms, "streamlimit_enforcer_sites", "state", state)
			if last == n || state != "fresh" && last > n {
				return time.Since(start), nil
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return 0, fmt.Errorf("%s took %.0f sites as %s after %v, want %.0f", p.site, last, state, time.Since(start).Round(time.Millisecond), n)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// scrapeFallbacks returns p's streamlimit_enforcer_fallback_decisions_total.
func scrapeFallbacks(p *mcProc) (float64, error) {
	ms, err := p.metrics("streamlimit_enforcer_fallback_decisions_total")
	if err != nil {
		return 0, err
	}
	return metric(ms, "streamlimit_enforcer_fallback_decisions_total"), nil
}

// logMigrations logs, for each switch of a migrating client under its limit, the false 429s
// it got at the data center it moved to within one window, and how long after the switch
// the last of them came: how fast the new data center gives it the room left in its window.
func logMigrations(t *testing.T, rs []result, names []string) {
	t.Helper()
	oracle := oracleAdmits(rs, ruleLimit, ruleWindow)
	var lines []string
	for at := mcMigrateEvery; at < mcEnd; at += mcMigrateEvery {
		var n int
		var last time.Duration
		for i, r := range rs {
			if r.sent >= at && r.sent < at+ruleWindow && oracle[i] && !r.admitted {
				n++
				last = r.recv - at
			}
		}
		phase := "no cut"
		if at >= mcCutAt && at < mcHealAt {
			phase = "cut"
		}
		lines = append(lines, fmt.Sprintf("  at %4.0fs to %s (%s): %2d false 429s, the last %.2fs after the switch",
			at.Seconds(), names[int(at/mcMigrateEvery)%len(names)], phase, n, last.Seconds()))
	}
	t.Logf("FIGURE multicluster: mig-light's switches of data center\n%s", strings.Join(lines, "\n"))
}

// startDCProcesses starts, per data center, an aggregator process (`streamlimit
// aggregator`) over its hits and the copies of the others' hits into its counts topic, and
// mcProcsPerDC enforcer processes (`streamlimit enforcer`), each a site of its own counting
// in process, in rotation once ready. It returns once every enforcer hears every site.
func startDCProcesses(t *testing.T, bin string, base []*dc) []*mcDC {
	t.Helper()
	rulesPath := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, rulesPath, rulesYAML(ruleLimit, ruleWindow))
	var aggs []*proc
	for _, d := range base {
		agg := newProc(t, bin, "aggregator "+d.Name, "aggregator", "--brokers", d.Addr,
			"--hits-topic", topics.DefaultHitsTopic, "--counts-topic", topics.DefaultCountsTopic,
			"--group", "aggregator-"+d.Name, "--instance-id", "aggregator-"+d.Name, "--max-window", "1m",
			"--admin-listen", anyPort, "--log-level", "warn")
		if err := agg.start(); err != nil {
			t.Fatal(err)
		}
		aggs = append(aggs, agg)
	}
	for _, agg := range aggs {
		if err := agg.waitReady(90 * time.Second); err != nil {
			t.Fatal(err)
		}
	}
	var dcs []*mcDC
	for i, d := range base {
		md := &mcDC{dc: d, agg: aggs[i]}
		for k := range mcProcsPerDC {
			site := fmt.Sprintf("%s-%d", d.Name, k+1)
			p := &mcProc{site: site, proc: newProc(t, bin, "enforcer "+site, "enforcer", "--site", site,
				"--brokers", d.Addr, "--rules", rulesPath, "--rules-reload-interval", "200ms",
				"--http-listen", anyPort, "--grpc-listen", "off", "--log-level", "info")}
			if err := p.start(); err != nil {
				t.Fatal(err)
			}
			md.procs = append(md.procs, p)
		}
		dcs = append(dcs, md)
	}
	all := float64(len(base) * mcProcsPerDC)
	for _, d := range dcs {
		for _, p := range d.procs {
			if err := p.waitReady(60 * time.Second); err != nil {
				t.Fatal(err)
			}
			if _, err := waitState(context.Background(), p, "fresh", all, time.Now().Add(60*time.Second)); err != nil {
				t.Fatal(err)
			}
			p.live.Store(true)
		}
	}
	return dcs
}

// mcWorkers is how many requests the load generator has in flight at most; mcQueue how
// many more may wait for a worker before a request is recorded as failed (an overloaded
// machine then shows as errors, not as a slower schedule).
const (
	mcWorkers = 64
	mcQueue   = 4096
)

// runClients sends each client's requests on its schedule (open loop), timed from start,
// through send, until ctx ends, waits for the requests in flight and returns them all. A
// request's sent time is when it was due: time spent waiting for a worker counts in its
// round trip.
func runClients(ctx context.Context, start time.Time, clients []mcClient, send func(client string, dc int, sent time.Duration) result) []result {
	type job struct {
		client string
		dc     int
		sent   time.Duration
	}
	jobs := make(chan job, mcQueue)
	var mu sync.Mutex
	var out []result
	record := func(r result) {
		mu.Lock()
		out = append(out, r)
		mu.Unlock()
	}
	var workers, sched sync.WaitGroup
	for range mcWorkers {
		workers.Go(func() {
			for j := range jobs {
				record(send(j.client, j.dc, j.sent))
			}
		})
	}
	for _, c := range clients {
		sched.Go(func() {
			interval := time.Duration(float64(time.Second) / c.rate)
			next := time.Now()
			for i := 0; ; i++ {
				if !sleepUntil(ctx, next) {
					return
				}
				at := time.Since(start)
				j := job{client: c.name, dc: c.dcAt(at, i), sent: at}
				select {
				case jobs <- j:
				default:
					record(result{client: c.name, node: j.dc, sent: at, recv: at,
						err: fmt.Errorf("load generator: %d requests waiting", mcQueue)})
				}
				next = next.Add(interval)
			}
		})
	}
	sched.Wait()
	close(jobs)
	workers.Wait()
	return out
}

// clientResults returns the answered requests of client, ordered by answer time: the
// decision was made within the round trip, and the answer time is the one every measure
// here uses, the oracle's included.
func clientResults(rs []result, client string) []result {
	var out []result
	for _, r := range rs {
		if r.client == client && r.answered() {
			out = append(out, r)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].recv < out[j].recv })
	return out
}

// oracleAdmits runs an exact global sliding-window log over rs (ordered by recv): a
// request at t is admitted iff fewer than limit were admitted in (t−w, t]. It is the rule
// of the accuracy simulator's oracle.
func oracleAdmits(rs []result, limit int, w time.Duration) []bool {
	out := make([]bool, len(rs))
	var log []time.Duration
	head := 0
	for i, r := range rs {
		for head < len(log) && log[head] <= r.recv-w {
			head++
		}
		if len(log)-head < limit {
			out[i] = true
			log = append(log, r.recv)
		}
	}
	return out
}

// mcPhase is a stretch of the timeline measured on its own: the requests answered in
// [from, to) and the sliding windows that lie in it. over bounds over≥ there; cut says
// that it overlaps the cut.
type mcPhase struct {
	name     string
	from, to time.Duration
	over     float64
	cut      bool
}

type mcFigures struct {
	requests, admitted, oracle, false429 int
	maxCount, sureCount                  int
	maxAt, sureAt                        time.Duration
	over, overSure, under                float64
}

func (f mcFigures) false429Pct() float64 {
	if f.requests == 0 {
		return 0
	}
	return 100 * float64(f.false429) / float64(f.requests)
}

func (p mcPhase) measure(rs []result, oracle []bool) mcFigures {
	var f mcFigures
	var times []time.Duration
	for i, r := range rs {
		if r.admitted {
			times = append(times, r.recv)
		}
		if r.recv < p.from || r.recv >= p.to {
			continue
		}
		f.requests++
		if r.admitted {
			f.admitted++
		}
		if oracle[i] {
			f.oracle++
			if !r.admitted {
				f.false429++
			}
		}
	}
	ws := sliding(times, ruleWindow, p.from, p.to)
	f.maxCount, f.maxAt = ws.max, ws.maxAt
	f.over = float64(ws.max) / ruleLimit
	f.sureCount, f.sureAt = surelyInWindow(rs, ruleWindow, p.from, p.to, nil)
	f.overSure = float64(f.sureCount) / ruleLimit
	f.under = 1
	if f.oracle > 0 {
		f.under = float64(f.admitted) / float64(f.oracle)
	}
	return f
}

// ageSampler records, every second, what the first enforcer process of each data center
// makes of the sites: the oldest live site's age in its snapshot (now minus the time up to
// which its hits are counted) and how many sites it takes to be in each state. Outside the
// crash and the cut no live site should be taken as silent: when the pipeline lags beyond
// topics.SiteSilentAfter (a machine too loaded for its brokers to answer in time, or broken
// site heartbeats), every site looks cut off, each reserves room for the others, and the
// figures measure that instead of the lifecycle.
type ageSampler struct {
	mu      sync.Mutex
	samples []ageSample
}

type ageSample struct {
	at     time.Duration
	site   string
	oldest float64 // seconds
	fresh  float64
	silent float64 // cut or crashed
	left   float64
}

func (a *ageSampler) run(ctx context.Context, start time.Time, dcs []*mcDC) {
	for sleepUntil(ctx, time.Now().Add(time.Second)) {
		for _, d := range dcs {
			p := d.procs[0]
			ms, err := p.metrics("streamlimit_snapshot_site_age", "streamlimit_enforcer_sites")
			if err != nil {
				continue // restarting
			}
			s := ageSample{at: time.Since(start), site: p.site,
				fresh:  metric(ms, "streamlimit_enforcer_sites", "state", "fresh"),
				silent: metric(ms, "streamlimit_enforcer_sites", "state", "cut") + metric(ms, "streamlimit_enforcer_sites", "state", "crashed"),
				left:   metric(ms, "streamlimit_enforcer_sites", "state", "left")}
			for _, m := range ms {
				if m.name == "streamlimit_snapshot_site_age_seconds" {
					s.oldest = max(s.oldest, m.value)
				}
			}
			a.mu.Lock()
			a.samples = append(a.samples, s)
			a.mu.Unlock()
		}
	}
}

// summary returns, over the samples taken in [from, to): the 50th and 90th percentiles and
// the maximum of the oldest live site's age, the share of samples in which some site was
// taken as silent (cut or crashed), and the number of samples.
func (a *ageSampler) summary(from, to time.Duration) (p50, p90, most, silent float64, n int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	var ages []float64
	var sil int
	for _, s := range a.samples {
		if s.at < from || s.at >= to {
			continue
		}
		ages = append(ages, s.oldest)
		if s.silent > 0 {
			sil++
		}
	}
	if len(ages) == 0 {
		return 0, 0, 0, 0, 0
	}
	slices.Sort(ages)
	at := func(q float64) float64 { return ages[min(int(q*float64(len(ages))), len(ages)-1)] }
	return at(0.5), at(0.9), ages[len(ages)-1], float64(sil) / float64(len(ages)), len(ages)
}
