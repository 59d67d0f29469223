package e2e_test

import (
	"context"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/streamlimit/streamlimit/aggregator"
	"github.com/streamlimit/streamlimit/enforcer/server"
	"github.com/streamlimit/streamlimit/topics"
)

// The timeline of TestMultiClusterWAN, from the start of the load. Every phase is a few
// windows of ruleWindow, so that the test stays within a few minutes.
const (
	// mcWarm is the first window plus the pipeline's settling, not measured.
	mcWarm = ruleWindow + lagAllowance
	// mcFailoverAt is when every client of the failover group moves from eu to us.
	mcFailoverAt = 20 * time.Second
	// mcCutAt and mcHealAt bound the cut of both links between the data centers.
	mcCutAt  = 35 * time.Second
	mcHealAt = mcCutAt + 25*time.Second
	// mcEnd ends the load.
	mcEnd = mcHealAt + 20*time.Second
	// mcMigrateEvery is how often the migrating client switches data center.
	mcMigrateEvery = 8 * time.Second
)

// The bounds of TestMultiClusterWAN, on every client and phase: over-admission (the most
// admitted in any sliding window, over the limit; for the clients above their limits) and
// under-admission (admitted over what an exact global sliding-window log admits of the
// same requests). A target missed is logged as TARGET MISSED; a hard bound missed fails the
// test. The hard bounds catch a global limit that is broken — two data centers that each
// admit the whole limit (2×, or 1.5× for the migrating client), a partition that is not
// bounded, a client starved where it moves — with room for the measured behaviour of the
// current sharing rule, which misses the targets during a cut, and for a machine so loaded
// that the pipeline lags by a second (docs/multidc.md). The hard bound on over-admission
// applies to the admissions that surely lie in a window (surelyInWindow), so that slow
// answers cannot fail it by themselves.
const (
	mcTargetOver    = 1.03 // outside the cut
	mcTargetOverCut = 1.05 // in any window that overlaps the cut
	mcTargetUnder   = 0.90
	mcHardOver      = 1.25
	mcHardOverCut   = 1.50
	mcHardUnder     = 0.60
	// mcTargetFalse429 is the target share of false 429s, outside the cut, of a client
	// under its limit (every 429 it gets is false).
	mcTargetFalse429 = 0.01
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
}

// TestMultiClusterWAN runs two data centers as in production: an independent Kafka cluster
// each, MirrorMaker 2 (from Kafka's jars, on deploy/mm2.properties) copying each one's hits
// to the other through a link with 40 ms ± 10 ms of latency each way, one aggregator group
// and one counts topic per data center, and one enforcer per data center. Clients: a steady
// one at 3× its limit spread over both data centers, a migrating one at 1.5× that switches
// data center every 8 s and a lighter one at 0.8× on the same schedule, and a failover group
// under their limits at eu that all move to us at once; then both links are cut for 25 s and
// healed (a probe hit must not cross while cut, and must once healed). Every admission is measured
// against an exact global sliding-window log on the same requests; the figures are logged
// as a table (docs/multidc.md) and bounded.
func TestMultiClusterWAN(t *testing.T) {
	begin := time.Now()
	dcs := startMirroredDCs(t, "eu", "us")
	nodes := startDCServices(t, dcs)
	t.Logf("FIGURE multicluster: 2 clusters, MirrorMaker, aggregators and enforcers ready in %v", time.Since(begin).Round(time.Second))

	limitRate := ruleLimit / ruleWindow.Seconds()
	migrate := func(t time.Duration, _ int) int { return int(t/mcMigrateEvery) % 2 }
	clients := []mcClient{
		{name: "steady", rate: 3 * limitRate, over: true, dcAt: func(_ time.Duration, i int) int { return i % 2 }},
		{name: "migrating", rate: 1.5 * limitRate, over: true, dcAt: migrate},
		{name: "mig-light", rate: 0.8 * limitRate, dcAt: migrate},
	}
	for i := range 4 {
		clients = append(clients, mcClient{name: fmt.Sprintf("failover-%d", i), rate: 0.6 * limitRate,
			dcAt: func(t time.Duration, _ int) int {
				if t < mcFailoverAt {
					return 0
				}
				return 1
			}})
	}

	g := newLoadGen(nodes, 0, 0, 0)
	g.start = time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), mcEnd)
	defer cancel()
	var links sync.WaitGroup
	links.Go(func() {
		if !sleepUntil(ctx, g.start.Add(mcCutAt)) {
			return
		}
		for _, d := range dcs {
			d.link.Cut()
		}
		t.Logf("links cut at %.1fs", time.Since(g.start).Seconds())
		// The harness itself: while cut, MirrorMaker can no longer carry a hit across.
		if err := probeBlocked(dcs[0], dcs[1], 5*time.Second); err != nil {
			t.Error(err)
		}
		if !sleepUntil(ctx, g.start.Add(mcHealAt)) {
			return
		}
		for _, d := range dcs {
			if err := d.link.Heal(); err != nil {
				t.Error(err)
			}
		}
		t.Logf("links healed at %.1fs", time.Since(g.start).Seconds())
	})
	runClients(ctx, g, clients)
	links.Wait()
	// And once healed, it carries hits again.
	waitCrossed(t, dcs[0], dcs[1], 2*time.Minute)
	rs := g.snapshot()

	all := summarize(rs, 0, mcEnd)
	t.Logf("FIGURE multicluster: %d requests, %d transport errors, %d not answered as decided (200 or 429), max RTT %v", all.requests, all.errors, all.non200, all.maxRTT)
	// A few connections reset on a machine too loaded to answer within seconds are the
	// machine's; more, or an answer whose status is not its decision's, are the
	// enforcers'. Failed requests are left out of every figure below.
	if all.non200 > 0 || all.errors > all.requests/100 {
		t.Errorf("%d requests failed and %d were not answered as decided (first error: %v)", all.errors, all.non200, all.firstErr)
	} else if all.errors > 0 {
		t.Logf("%d of %d requests failed (first error: %v), left out of the figures", all.errors, all.requests, all.firstErr)
	}

	phases := []mcPhase{
		{name: "wan", from: mcWarm, to: mcCutAt, targetOver: mcTargetOver, hardOver: mcHardOver},
		// Every window that overlaps the cut, up to one window after healing.
		{name: "cut", from: mcCutAt - ruleWindow, to: mcHealAt + ruleWindow, targetOver: mcTargetOverCut, hardOver: mcHardOverCut},
		{name: "healed", from: mcHealAt + lagAllowance, to: mcEnd, targetOver: mcTargetOver, hardOver: mcHardOver},
	}
	var table []string
	table = append(table, fmt.Sprintf("%-11s %-6s %8s %8s %8s %7s %7s %7s %10s", "client", "phase", "requests", "admitted", "oracle", "over", "over≥", "under", "false 429"))
	for _, c := range clients {
		mine := clientResults(rs, c.name)
		oracle := oracleAdmits(mine, ruleLimit, ruleWindow)
		for _, p := range phases {
			f := p.measure(mine, oracle)
			table = append(table, fmt.Sprintf("%-11s %-6s %8d %8d %8d %7.3f %7.3f %7.3f %5d %4.1f%%",
				c.name, p.name, f.requests, f.admitted, f.oracle, f.over, f.overSure, f.under, f.false429, f.false429Pct()))
			if c.over {
				if f.overSure > p.hardOver {
					t.Errorf("%s, %s: %d admitted within the window ending at %.2fs, timed by request and answer = %.3f × the limit, above the bound %.2f",
						c.name, p.name, f.sureCount, f.sureAt.Seconds(), f.overSure, p.hardOver)
				}
				if f.over > p.targetOver {
					t.Logf("TARGET MISSED %s, %s: %d admitted in the window ending at %.2fs = %.3f × the limit, above the target %.2f",
						c.name, p.name, f.maxCount, f.maxAt.Seconds(), f.over, p.targetOver)
				}
			}
			underMsg := fmt.Sprintf("%s, %s: admitted %d where an exact global limit admits %d (%.3f); %d false 429s",
				c.name, p.name, f.admitted, f.oracle, f.under, f.false429)
			if !c.over && p.name != "cut" && f.false429Pct() > 100*mcTargetFalse429 {
				t.Logf("TARGET MISSED %s, %s: %d false 429s of %d requests (%.1f%%), above the target %.0f%%",
					c.name, p.name, f.false429, f.requests, f.false429Pct(), 100*mcTargetFalse429)
			}
			if f.under < mcHardUnder {
				t.Errorf("%s, below the bound %.2f", underMsg, mcHardUnder)
			} else if f.under < mcTargetUnder {
				t.Logf("TARGET MISSED %s, below the target %.2f", underMsg, mcTargetUnder)
			}
		}
	}
	logMigrations(t, clientResults(rs, "mig-light"), nodes)
	t.Logf("FIGURE multicluster: limit %d per %v; over = most admitted in a sliding window ÷ limit, admissions timed by their answer; over≥ = the same counting only admissions whose request and answer both lie in the window (a lower bound, whatever the round trip); under = admitted ÷ admitted by an exact global log; false 429 = denied where the exact log admits\n%s",
		ruleLimit, ruleWindow, strings.Join(table, "\n"))
}

// logMigrations logs, for each switch of a migrating client under its limit, the false 429s
// it got at the data center it moved to within one window, and how long after the switch
// the last of them came: how fast the new data center gives it the room left in its window.
func logMigrations(t *testing.T, rs []result, nodes []*node) {
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
		phase := "wan"
		if at >= mcCutAt && at < mcHealAt {
			phase = "cut"
		} else if at >= mcHealAt {
			phase = "healed"
		}
		lines = append(lines, fmt.Sprintf("  at %4.0fs to %s (%s): %2d false 429s, the last %.2fs after the switch",
			at.Seconds(), nodes[int(at/mcMigrateEvery)%2].site, phase, n, last.Seconds()))
	}
	t.Logf("FIGURE multicluster: mig-light's switches of data center\n%s", strings.Join(lines, "\n"))
}

// startDCServices starts, per data center, an aggregator group over its hits and the
// copies of the others' hits into its counts topic, and one enforcer whose site is the
// data center, counting its own site in process. It returns the enforcers in dcs' order.
func startDCServices(t *testing.T, dcs []*dc) []*node {
	t.Helper()
	rulesPath := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, rulesPath, rulesYAML(ruleLimit, ruleWindow))
	var aggs []*aggregator.Aggregator
	for _, d := range dcs {
		hits := []string{topics.DefaultHitsTopic}
		for _, o := range dcs {
			if o != d {
				hits = append(hits, topics.RemoteHitsTopic(o.Name, topics.DefaultHitsTopic))
			}
		}
		agg, err := aggregator.New(aggregator.Config{
			Brokers:     []string{d.Addr},
			Group:       "aggregator-" + d.Name,
			Topics:      hits,
			CountsTopic: topics.DefaultCountsTopic,
			MaxWindow:   time.Minute,
			InstanceID:  "aggregator-" + d.Name,
			Logger:      testLogger(t).With("aggregator", d.Name),
			Registerer:  prometheus.NewRegistry(),
		})
		if err != nil {
			t.Fatal(err)
		}
		runInBackground(t, "aggregator "+d.Name, agg.Run)
		aggs = append(aggs, agg)
	}
	for i, agg := range aggs {
		eventually(t, 90*time.Second, "aggregator "+dcs[i].Name+" ready", agg.Ready)
	}
	var nodes []*node
	for _, d := range dcs {
		reg := prometheus.NewRegistry()
		srv, err := server.New(server.Config{
			Site:           d.Name,
			RulesPath:      rulesPath,
			ReloadInterval: 200 * time.Millisecond,
			Brokers:        []string{d.Addr},
			HitsTopic:      topics.DefaultHitsTopic,
			CountsTopic:    topics.DefaultCountsTopic,
			HTTPAddr:       "127.0.0.1:0",
			GRPCAddr:       "off",
			Logger:         testLogger(t).With("site", d.Name),
			Registry:       reg,
		})
		if err != nil {
			t.Fatal(err)
		}
		n := &node{site: d.Name, srv: srv, reg: reg, addr: srv.HTTPAddr()}
		n.stop = runInBackground(t, "enforcer "+d.Name, srv.Run)
		nodes = append(nodes, n)
	}
	for _, n := range nodes {
		eventually(t, 60*time.Second, "enforcer "+n.site+" snapshot restored", func() bool { ok, _ := n.srv.Ready(); return ok })
	}
	return nodes
}

// runClients sends each client's requests on its schedule (open loop, as loadGen.run),
// timed from g.start, until ctx ends, and waits for the requests in flight.
func runClients(ctx context.Context, g *loadGen, clients []mcClient) {
	sem := make(chan struct{}, 1024)
	var inflight, sched sync.WaitGroup
	for _, c := range clients {
		sched.Go(func() {
			interval := time.Duration(float64(time.Second) / c.rate)
			next := time.Now()
			for i := 0; ; i++ {
				if !sleepUntil(ctx, next) {
					return
				}
				node := c.dcAt(time.Since(g.start), i)
				select {
				case sem <- struct{}{}:
					inflight.Go(func() {
						defer func() { <-sem }()
						g.record(g.check(c.name, node))
					})
				default:
					g.record(result{client: c.name, node: node, sent: time.Since(g.start), recv: time.Since(g.start),
						err: fmt.Errorf("load generator: %d requests in flight", cap(sem))})
				}
				next = next.Add(interval)
			}
		})
	}
	sched.Wait()
	inflight.Wait()
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
// [from, to) and the sliding windows that lie in it.
type mcPhase struct {
	name                 string
	from, to             time.Duration
	targetOver, hardOver float64
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
	f.sureCount, f.sureAt = surelyInWindow(rs, ruleWindow, p.from, p.to)
	f.overSure = float64(f.sureCount) / ruleLimit
	f.under = 1
	if f.oracle > 0 {
		f.under = float64(f.admitted) / float64(f.oracle)
	}
	return f
}
