package e2e_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamlimit/streamlimit/internal/testenv"
	"github.com/streamlimit/streamlimit/topics"
)

// failoverRules limits each user to 100 requests per 5 s, globally, and counts them over
// 10 minutes too with a limit never reached: a request the first limit denies takes nothing
// from the second (a denied request takes no quota), so that the 10-minute count of a user
// at a site is exactly the requests admitted there during the test.
const failoverRules = `domain: e2e
descriptors:
  - key: user
    rate_limits:
      - {window: 5s, requests_per_unit: 100, scope: global}
      - {window: 10m, requests_per_unit: 100000000, scope: global}
`

// Bounds of TestAggregatorFailover.
const (
	// failoverSession is the aggregators' session timeout in the test.
	failoverSession = 10 * time.Second
	// maxGap is the longest a source partition may go without a heartbeat, or a hit wait
	// for a count of its key, while a quorum of aggregators runs and no member dies without
	// leaving; maxKillGap is the bound for the slots of a member killed and not restarted.
	maxGap     = 3 * time.Second
	maxKillGap = failoverSession + 2*time.Second
)

// TestAggregatorFailover runs three data centers' enforcers under load with a group of
// aggregator processes (session timeout 10 s, static membership), and puts the group
// through what operators do to it: an aggregator SIGKILLed and restarted at once under the
// same instance id, a fourth one joining, one stopped with SIGTERM, and one SIGKILLed for
// good. Throughout, from the counts topic: no source partition goes more than 3 s without a
// heartbeat and no hit waits more than 3 s for a count of its key, except in the slots of the
// member killed for good, which wait for its session to time out (at most 10 + 2 s). The
// restart moves nothing (the other members see no group event); the join and the SIGTERM
// move only the slots that change hands. No enforcer decision is a fallback on stale counts
// while a quorum of aggregators runs (the first three steps; a slow Redis's fallbacks are
// the enforcer's own); the reservations made for sites taken as silent are reported. After
// the load, every count equals the requests admitted, per user and site.
func TestAggregatorFailover(t *testing.T) {
	brokers := testenv.Brokers(t)
	const parts = 6
	tp := startTopology(t, topologyOptions{brokers: brokers, partitions: parts, rules: failoverRules, noAggregator: true})
	rec := startPublicationLog(t, brokers, tp.counts)
	// The broker's own stalls: a group session expires, and a rebalance ends, on the
	// broker's clock and only as fast as it answers; a machine that starves it stretches
	// the killed member's gap by as much, which the gap's bound allows for.
	adm := testenv.AdminClient(t)
	brokerStalls := testenv.StartServiceStalls(t, "kafka", 250*time.Millisecond, func(ctx context.Context) error {
		_, err := adm.ListBrokers(ctx)
		return err
	})

	cc := childConfig{Brokers: brokers, TopicPattern: topics.HitsPattern(tp.base), CountsTopic: tp.counts,
		Group: testenv.TopicName(t, "group"), MaxWindow: 15 * time.Minute, SessionTimeout: failoverSession, LogLevel: "info"}
	start := func(id string) *child {
		c := cc
		c.InstanceID = id
		return startChild(t, id, c)
	}
	a, b, c := start("agg-a"), start("agg-b"), start("agg-c")
	for _, x := range []*child{a, b, c} {
		x.waitReady(90 * time.Second)
	}
	eventually(t, 60*time.Second, "every slot owned", func() bool { return a.assigned()+b.assigned()+c.assigned() == 3*parts })

	g := newLoadGen(tp.nodes, 50, 10, 2)
	stopLoad := g.background(t)

	// Enforcers on Redis fall back when Redis answers too slowly (a loaded machine, and
	// starting an aggregator process is a burst of load): those fallbacks are the enforcer's
	// own (reason "redis"), read at every phase's start, as are the reservations made for
	// sites taken as silent (not fallbacks: docs/sites.md).
	var ph phases
	var redisFallbacks, reservations [][]float64
	mark := func(name string) {
		ph.mark(name)
		var rf, rv []float64
		for _, n := range tp.nodes {
			ms := gather(t, n.reg)
			rf = append(rf, metric(ms, "streamlimit_enforcer_fallback_decisions_total", "reason", "redis"))
			rv = append(rv, metric(ms, "streamlimit_enforcer_silent_site_reservations_total"))
		}
		redisFallbacks, reservations = append(redisFallbacks, rf), append(reservations, rv)
	}
	mark("warm")
	time.Sleep(6 * time.Second)

	// 1. SIGKILL and an immediate restart under the same instance id: no rebalance.
	mark("kill-restart")
	events := func(x *child, ev string) float64 {
		return metric(x.metrics(), "streamlimit_aggregator_group_events_total", "event", ev)
	}
	revoked := func(xs ...*child) (n float64) {
		for _, x := range xs {
			n += metric(x.metrics(), "streamlimit_aggregator_group_partitions_total", "event", "revoked")
		}
		return n
	}
	bEvents, cEvents := events(b, "assigned")+events(b, "revoked"), events(c, "assigned")+events(c, "revoked")
	aSlots := a.assigned()
	a.kill()
	a = start("agg-a")
	a.waitReady(30 * time.Second)
	restarted := ph.since()
	time.Sleep(7 * time.Second)
	if n := events(b, "assigned") + events(b, "revoked") + events(c, "assigned") + events(c, "revoked") - bEvents - cEvents; n != 0 {
		t.Errorf("restarting agg-a under its instance id caused %v assignments or revocations at the other members: a rebalance", n)
	}
	if got := a.assigned(); got != aSlots {
		t.Errorf("agg-a had %d partitions before its restart and %d after", aSlots, got)
	}

	// 2. A fourth member joins: only the slots it takes move.
	mark("join")
	before := revoked(a, b, c)
	d := start("agg-d")
	d.waitReady(30 * time.Second)
	eventually(t, 30*time.Second, "agg-d owns slots", func() bool { return d.assigned() > 0 })
	time.Sleep(6 * time.Second)
	moved := d.assigned()
	if n := revoked(a, b, c) - before; n != float64(moved) {
		t.Errorf("agg-d joined and took %d partitions, but the others revoked %v", moved, n)
	}

	// 3. SIGTERM: it leaves at once, and the others take its slots.
	mark("sigterm")
	before = revoked(a, c, d)
	termTook := b.term(30 * time.Second)
	eventually(t, 30*time.Second, "agg-b's slots taken over", func() bool {
		return a.assigned()+c.assigned()+d.assigned() == 3*parts && a.ready() && c.ready() && d.ready()
	})
	time.Sleep(6 * time.Second)
	if n := revoked(a, c, d) - before; n != 0 {
		t.Errorf("agg-b left, and the others revoked %v partitions", n)
	}

	// 4. SIGKILL for good: its slots wait for its session to time out.
	mark("kill")
	killedAt := time.Now()
	cParts := c.assigned()
	c.kill()
	eventually(t, 60*time.Second, "agg-c's slots taken over", func() bool {
		return a.assigned()+d.assigned() == 3*parts && a.ready() && d.ready()
	})
	takenOver := time.Since(killedAt)
	time.Sleep(3 * time.Second)
	mark("end")
	stopLoad()

	rs := g.snapshot()

	// Gaps, per phase.
	hits := map[string][]int64{}
	for _, s := range tp.sites {
		readTopic(t, brokers, s.topic, func(r *kgo.Record) {
			// Admitted hits of the 10-minute keys: their totals only grow during the test, so
			// every one is published again (a sliding 5 s count whose hits come as fast as
			// they leave keeps its total, and an unchanged total is not republished at once;
			// refused requests change no total).
			if h, err := topics.DecodeHit(r.Value); err == nil && strings.HasSuffix(h.Key, "#600s") && h.Count > 0 {
				hits[string(r.Key)] = append(hits[string(r.Key)], r.Timestamp.UnixMilli())
			}
		})
	}
	owned := rec.ownedBy("agg-c", killedAt.Add(-2*time.Second), killedAt)
	gaps := rec.gaps(ph, parts, owned, hits)
	for _, p := range ph.names[:len(ph.names)-1] {
		t.Logf("FIGURE failover %-12s longest heartbeat gap %v (%s), longest wait of a hit for its count %v (%s)", p,
			gaps[p].hb.d, gaps[p].hb.what, gaps[p].count.d, gaps[p].count.what)
	}
	t.Logf("FIGURE failover kill       agg-c's slots %v: longest heartbeat gap %v (%s), wait for a count %v (%s); taken over %v after the kill",
		owned, gaps["kill"].killedHB.d, gaps["kill"].killedHB.what, gaps["kill"].killedCount.d, gaps["kill"].killedCount.what, takenOver.Round(time.Millisecond))
	t.Logf("FIGURE failover: agg-a restarted and ready in %v; agg-d took %d partitions; agg-b exited %v after SIGTERM; agg-c had %d partitions",
		restarted.Round(time.Millisecond), moved, termTook.Round(time.Millisecond), cParts)
	for _, p := range ph.names[:len(ph.names)-1] {
		for _, gp := range []gap{gaps[p].hb, gaps[p].count} {
			// A member that joins or rejoins does so on the broker's clock: a broker that
			// does not answer stretches the gap by as long (the meter's probe, which no
			// aggregator shares, measures it).
			stalled := brokerStalls.Summary(gp.from, gp.from.Add(gp.d), 0)
			if bound := maxGap + stalled.Stalled; gp.d > bound {
				t.Errorf("%s: %s: %v without a record (bound %v: %v + the broker's stalls in the gap, %s)", p, gp.what, gp.d, bound, maxGap, stalled)
			}
		}
	}
	for _, gp := range []gap{gaps["kill"].killedHB, gaps["kill"].killedCount} {
		stalled := brokerStalls.Summary(killedAt, killedAt.Add(gp.d), 0)
		if bound := maxKillGap + stalled.Stalled; gp.d > bound {
			t.Errorf("kill: %s: %v without a record (bound %v: the session timeout + 2 s + the broker's stalls in the gap, %s)", gp.what, gp.d, bound, stalled)
		}
	}

	// Fallbacks: a decision is one when the counts are stale (past --max-staleness, or a
	// source said it replays), the same at every enforcer, or when its Redis failed it (a
	// loaded machine; starting an aggregator process is a burst of load). So the enforcer
	// without Redis (ap) tells: no fallback there while a quorum of aggregators ran (phases
	// 1-3). The others' are reported, with the reservations made for sites taken as silent.
	inProcess := map[int]bool{}
	for n, x := range tp.nodes {
		for _, st := range tp.sites {
			inProcess[n] = inProcess[n] || st.name == x.site && st.redis == nil
		}
	}
	for i, p := range []string{"warm", "kill-restart", "join", "sigterm", "kill"} {
		from, to := ph.offsets(p, g.start)
		fb := map[int]int{}
		var when []string
		for _, r := range rs {
			if !r.fallback || r.sent < from || r.sent >= to {
				continue
			}
			fb[r.node]++
			if len(when) < 6 {
				when = append(when, fmt.Sprintf("%d@+%.2fs", r.node, (r.sent-from).Seconds()))
			}
		}
		var reserved, redis float64
		for n := range tp.nodes {
			reserved += reservations[i+1][n] - reservations[i][n]
			redis += redisFallbacks[i+1][n] - redisFallbacks[i][n]
		}
		t.Logf("FIGURE failover %-12s fallback decisions by enforcer: %v %v (Redis fallbacks %.0f); silent-site reservations: %.0f", p, fb, when, redis, reserved)
		if p == "kill" {
			continue // a member died without leaving: its partitions' counts go stale until its session times out
		}
		for n, k := range fb {
			if inProcess[n] {
				t.Errorf("%s: enforcer %d (%s, no Redis) made %d fallback decisions while a quorum of aggregators ran", p, n, tp.nodes[n].site, k)
			}
		}
	}

	// Counts exact once the enforcers' producers have flushed: every user's 10-minute count
	// at each site equals the requests admitted there.
	all := summarize(rs, 0, time.Hour)
	if all.errors > 0 || all.non200 > 0 {
		t.Fatalf("%d requests failed and %d were not answered as decided (first error: %v): admissions unknown", all.errors, all.non200, all.firstErr)
	}
	want := map[string]map[string]int64{}
	for _, r := range rs {
		if !r.admitted {
			continue
		}
		key := fmt.Sprintf("%s|user=%s#600s", domain, r.client)
		if want[key] == nil {
			want[key] = map[string]int64{}
		}
		want[key][tp.nodes[r.node].site]++
	}
	var got map[string]topics.Count
	eventually(t, 60*time.Second, "10-minute counts equal the requests admitted", func() bool {
		got = readCounts(t, brokers, tp.counts)
		for k := range got {
			if !strings.HasSuffix(k, "#600s") {
				delete(got, k)
			}
		}
		return countsEqual(want, got) == ""
	})
	if diff := countsEqual(want, got); diff != "" {
		t.Errorf("counts after settling: %s", diff)
	}
}

// phases are the named steps of a test, by wall-clock start.
type phases struct {
	names []string
	at    []time.Time
}

func (p *phases) mark(name string) {
	p.names = append(p.names, name)
	p.at = append(p.at, time.Now())
}

// since returns the time since the last mark.
func (p *phases) since() time.Duration { return time.Since(p.at[len(p.at)-1]) }

// bounds returns when phase name began and ended (the next mark), in unix ms.
func (p *phases) bounds(name string) (from, to int64) {
	i := slices.Index(p.names, name)
	to = time.Now().UnixMilli()
	if i+1 < len(p.at) {
		to = p.at[i+1].UnixMilli()
	}
	return p.at[i].UnixMilli(), to
}

// offsets returns the phase's bounds as offsets from start (the load generator's).
func (p *phases) offsets(name string, start time.Time) (from, to time.Duration) {
	f, t := p.bounds(name)
	return time.UnixMilli(f).Sub(start), time.UnixMilli(t).Sub(start)
}

// publicationLog follows the counts topic and keeps when each heartbeat source and each
// count key was published (their as-of times), and by which instance for heartbeats.
type publicationLog struct {
	mu     sync.Mutex
	hb     map[string][]stamp // heartbeat key → stamps
	counts map[string][]stamp // count key → stamps
}

type stamp struct {
	at       int64 // as-of, unix ms
	instance string
	slot     int32
}

func startPublicationLog(t *testing.T, brokers []string, topic string) *publicationLog {
	cl := testenv.KafkaClient(t, kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	l := &publicationLog{hb: map[string][]stamp{}, counts: map[string][]stamp{}}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			fs := cl.PollFetches(ctx)
			if ctx.Err() != nil {
				return
			}
			l.mu.Lock()
			fs.EachRecord(func(r *kgo.Record) {
				switch {
				case topics.IsHeartbeatKey(r.Key):
					if h, err := topics.DecodeHeartbeat(r.Value); err == nil {
						l.hb[string(r.Key)] = append(l.hb[string(r.Key)], stamp{at: h.AsOf, instance: h.Instance, slot: h.Partition})
					}
				case len(r.Value) > 0 && !topics.IsReservedKey(r.Key):
					if c, err := topics.DecodeCount(r.Value); err == nil {
						l.counts[c.Key] = append(l.counts[c.Key], stamp{at: c.AsOf})
					}
				}
			})
			l.mu.Unlock()
		}
	})
	t.Cleanup(func() { cancel(); wg.Wait() })
	return l
}

// ownedBy returns the slots whose heartbeats instance wrote in [from, to].
func (l *publicationLog) ownedBy(instance string, from, to time.Time) []int32 {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []int32
	for _, ss := range l.hb {
		for _, s := range ss {
			if s.instance == instance && s.at >= from.UnixMilli() && s.at <= to.UnixMilli() && !slices.Contains(out, s.slot) {
				out = append(out, s.slot)
			}
		}
	}
	slices.Sort(out)
	return out
}

// gap is the longest time something went unpublished.
type gap struct {
	d    time.Duration
	what string
	from time.Time // when the gap began
}

func (g *gap) see(from time.Time, d time.Duration, what string) {
	if d > g.d {
		g.d, g.what, g.from = d, what, from
	}
}

// phaseGaps are a phase's longest gaps, those of the killed member's slots apart.
type phaseGaps struct {
	hb, count, killedHB, killedCount gap
}

// gaps returns, per phase, the longest time between two consecutive heartbeats of a source
// (that ends in the phase), and the longest a hit (hits: hit record times by key) waited for
// a count: from the hit record's time to the as-of time of the first count of its key after
// it, by the phase in which the wait ends. A count is published when its total changes, so a
// key's counts pause whenever its hits do; what matters is that hits that came are counted. Gaps of the killed member's slots
// (killed: its slots in the phase "kill") are kept apart.
func (l *publicationLog) gaps(ph phases, parts int32, killed []int32, hits map[string][]int64) map[string]phaseGaps {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string]phaseGaps{}
	part := kgo.StickyKeyPartitioner(nil).ForTopic("")
	slotOf := func(key string) int32 { return int32(part.Partition(&kgo.Record{Key: []byte(key)}, int(parts))) }
	see := func(from, to int64, what string, slot int32, hb bool) {
		for _, p := range ph.names[:len(ph.names)-1] {
			start, end := ph.bounds(p)
			if to < start || to >= end {
				continue
			}
			d := time.Duration(to-from) * time.Millisecond
			desc := fmt.Sprintf("%s (slot %d) from +%.1fs", what, slot, float64(from-start)/1000)
			at := time.UnixMilli(from)
			pg := out[p]
			switch k := p == "kill" && slices.Contains(killed, slot); {
			case hb && k:
				pg.killedHB.see(at, d, desc)
			case hb:
				pg.hb.see(at, d, desc)
			case k:
				pg.killedCount.see(at, d, desc)
			default:
				pg.count.see(at, d, desc)
			}
			out[p] = pg
		}
	}
	sorted := func(ss []stamp) []int64 {
		ats := make([]int64, 0, len(ss))
		for _, s := range ss {
			ats = append(ats, s.at)
		}
		slices.Sort(ats)
		return ats
	}
	scan := func(what string, ss []stamp, slot int32, hb bool) {
		ats := sorted(ss)
		for i := 1; i < len(ats); i++ {
			see(ats[i-1], ats[i], what, slot, hb)
		}
	}
	for key, hs := range hits {
		counts := sorted(l.counts[key])
		for _, h := range hs {
			if i, _ := slices.BinarySearch(counts, h); i < len(counts) {
				see(h, counts[i], "a hit of "+key, slotOf(key), false)
			}
		}
	}
	for key, ss := range l.hb {
		if len(ss) > 0 {
			scan("heartbeat "+strings.TrimPrefix(key, topics.ReservedPrefix), ss, ss[0].slot, true)
		}
	}
	return out
}

// readTopic calls f with every record of topic, from its start to its end as listed now.
func readTopic(t *testing.T, brokers []string, topic string, f func(*kgo.Record)) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ends, err := kadmEnds(ctx, cl, topic)
	if err != nil {
		t.Fatal(err)
	}
	pos := map[int32]int64{}
	for {
		done := true
		for p, e := range ends {
			done = done && pos[p] >= e
		}
		if done {
			return
		}
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("reading %s: %v", topic, ctx.Err())
		}
		fs.EachRecord(func(r *kgo.Record) {
			pos[r.Partition] = r.Offset + 1
			f(r)
		})
	}
}
