// The global cap: what this site may count of a global limit, from the snapshot and its
// own exact count (docs/decisions.md, "Global limits").

package enforcer

import (
	"context"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/streamlimit/streamlimit/enforcer/algo"
	"github.com/streamlimit/streamlimit/enforcer/sitecount"
	"github.com/streamlimit/streamlimit/enforcer/snapshot"
	"github.com/streamlimit/streamlimit/internal/room"
	"github.com/streamlimit/streamlimit/topics"
)

// globalCap computes one global limit's cap on this site's count (for Commit) from the
// snapshot, with the key's total over all sites in the snapshot, and whether the decision
// is a fallback: the snapshot is stale and the limit is decided on a local share. Without
// a snapshot (a single site) the limit is this site's share, DefaultShare or the whole.
// A cap that reserves room for a silent site is not a fallback; it is counted in the
// metrics. h is op's key's handle (nil: none), whose caches spare lookups by key. horizon
// is how long past now the cap is spent on: 0 for a decision, the reporting horizon for a
// Reporter's quota; the other sites' spend over it is kept back from the room ahead.
//
// reported is, for a Reporter's quota, the demand its report stands for in the snapshot's
// terms (its requests per ms over the reporting period, times τ), which this site's
// demand is taken to be at least (withDemand); 0 for a decision.
func (l *Engine) globalCap(now time.Time, op *sitecount.Op, h *keyHandle, allow int64, horizon time.Duration, reported float64) (capLocal, total float64, fallback bool) {
	allowance := float64(allow)
	sn := l.cfg.Snapshot
	if sn == nil {
		return dither(allowance*l.share.staleShare(nil, false, nil), op.Key, now.Unix()), 0, false
	}
	stale := sn.StaleAt(now)
	if stale {
		// Written at most once a millisecond: every decision reads it, and a store per
		// decision would bounce its cache line between cores while stale.
		if ns := now.UnixNano(); ns-l.lastStale.Load() > int64(time.Millisecond) {
			l.lastStale.Store(ns)
		}
	}
	st := sn.SiteTimes()
	var (
		e     snapshot.Entry
		known bool
	)
	var reserved bool
	if h != nil && !stale {
		capLocal, total, reserved, e, known = l.cachedCap(now, op, h, sn, st, allowance, horizon, reported)
	} else {
		if h != nil {
			e, known = l.snapEntry(sn, h)
		} else {
			e, known = sn.Get(op.Key)
		}
		known = known && usable(&e, op, now)
		if known {
			total = e.Total
		}
		if stale {
			return dither(allowance*l.share.staleShare(&e, known, st), op.Key, salt(&e, known, now)), total, true
		}
		a := l.share.capFor(now, op.Key, allowance, &e, known, false, st, nil, 0, nil)
		capLocal, reserved = a.base, a.reserved
		l.restarted(now, op, &e, known, st)
	}
	if reserved {
		l.metrics.reserved.Inc()
	}
	if last := l.lastStale.Load(); last != 0 && now.UnixNano()-last < int64(min(op.Window, l.cfg.RecoveryHold)) {
		// Recovering from an outage: the fresh counts may still miss hits published
		// during it; each site also keeps to its share, which sum to the limit.
		capLocal = min(capLocal, dither(allowance*l.share.staleShare(&e, known, st), op.Key, salt(&e, known, now)))
	}
	return capLocal, total, false
}

// usable reports whether snapshot entry e counts op's counter at now: a count for another
// window is another counter, and one whose window has passed since its as-of time
// describes hits that are gone (the aggregator tombstones such keys, but not while no
// instance owns them).
func usable(e *snapshot.Entry, op *sitecount.Op, now time.Time) bool {
	return e.Window == op.Window && !e.Expired(now)
}

// salt is what rounds a cap: the count's as-of time, else the second.
func salt(e *snapshot.Entry, known bool, now time.Time) int64 {
	if known {
		return e.AsOf
	}
	return now.Unix()
}

// capKey is everything a global cap depends on besides the Engine's fixed settings.
type capKey struct {
	ver    uint64              // the snapshot's Version when the entry was read
	sites  *snapshot.SiteTimes // the site freshness in force
	states uint64              // the states of sites' sites (sharing.stateSig)
	allow  float64
	known  bool
	newKey bool
	salt   int64
}

// capCache is a key's last global cap and what it was computed from.
type capCache struct {
	key capKey
	set bool
	a   allotment // before Engine.finalCap
}

// cachedCap is the cap of a fresh snapshot's key through its handle: the entry from the
// handle's cache while the snapshot has not changed, and the cap itself while nothing it
// depends on has (the entry, the site freshness, the sites' states, the allowance, the
// rounding salt). A hot key's decision then costs a few comparisons instead of the whole
// share computation. It also keeps the key's breakdown from before any site went silent
// (keyGlobal.keepFrozen), by which silent sites are reserved their shares.
func (l *Engine) cachedCap(now time.Time, op *sitecount.Op, h *keyHandle, sn *snapshot.Snapshot, st *snapshot.SiteTimes, allowance float64, horizon time.Duration, reported float64) (capLocal, total float64, reserved bool, e snapshot.Entry, known bool) {
	v := sn.Version()
	sig, allFresh, cacheable := l.share.stateSig(now, st)
	g := l.keys.globalOf(h)
	g.mu.Lock()
	defer g.mu.Unlock()
	g.refresh(sn, v, h.key)
	e, known = g.entry, g.known && usable(&g.entry, op, now)
	if known {
		total = e.Total
	} else {
		g.unknownAt = now.UnixNano()
	}
	ms := now.UnixMilli()
	g.keepFrozen(ms, &e, known, allFresh, l.cfg.SiteStaleAfter.Milliseconds())
	if known {
		g.past.see(e.Sites, e.AsOf, l.share.servingSpan)
	}
	newKey := known && now.UnixNano()-g.unknownAt < int64(l.cfg.NewKeyHold)
	// Before finalCap reads this site's count: the hits of a previous instance given
	// to the counter are not taken for new hits the others have not seen.
	l.restarted(now, op, &e, known, st)
	k := capKey{ver: v, sites: st, states: sig, allow: allowance, known: known, newKey: newKey, salt: salt(&e, known, now)}
	var a allotment
	var sites [8]topics.SiteCount // withDemand's, without an allocation per report (most keys)
	if own, ok := withDemand(&e, l.cfg.Site, reported, sites[:0]); ok && known {
		// A report's quota: shared by the demand its report stands for, not cached (the
		// cache is the decisions').
		a = l.share.capFor(now, op.Key, allowance, &own, known, newKey, st, g.frozen, g.frozenAt, &g.past)
		if a.heavy {
			g.heavyUntil = ms + op.Window.Milliseconds()
		}
	} else {
		if !(cacheable && g.cc.set && g.cc.key == k) {
			g.cc = capCache{key: k, set: cacheable, a: l.share.capFor(now, op.Key, allowance, &e, known, newKey, st, g.frozen, g.frozenAt, &g.past)}
			if g.cc.a.heavy {
				g.heavyUntil = ms + op.Window.Milliseconds()
			}
		}
		a = g.cc.a
	}
	a.heavy = a.heavy || ms < g.heavyUntil
	own := g.arrive(ms, op.N)
	if a.peers > 0 {
		// The other sites of this data center see the client's requests alike (behind one
		// load balancer), and now, where the snapshot's demand shows them a lag late and
		// decayed: a surge here is taken to be one there.
		a.rate = max(a.rate, float64(a.peers)*own)
	}
	// The data centers that still serve the key may see a surge of it as this one does (a
	// client spread over them), where the snapshot shows it a lag late: each is taken to
	// be receiving at least this site's rate. One a client has left is not (serving,
	// Config.ServingSpan): the client would be refused here for room kept there.
	a.remote = max(a.remote, float64(a.serving)*own)
	// A report whose rate is under the limit's (a client under its limit, or one holder
	// of many of a client spread over them): see finalCap, "Seen as others".
	lump := horizon > 0 && reported/demandTau*float64(op.Window.Milliseconds()) < allowance
	return l.finalCap(now, op, &e, known, st, &a, horizon, lump), total, a.reserved, e, known
}

// withDemand returns e with site's demand raised to reported, and true, when reported is
// above the demand e shows for site; e itself is left as it is (its Sites are shared with
// the snapshot). The returned entry's Sites are appended to buf.
//
// A caller that decides requests itself and reports their usage every few seconds (an
// Envoy of the Rate Limit Quota Service: every 5 s) reaches the counts in lumps. Its
// site's demand in the snapshot, requests weighted by e^(−age/τ) with τ = 1 s, is a spike
// at each lump that has all but faded (e⁻⁵) by the next, and its site's cap is computed at
// that next report: from a demand at its lowest, against the prior spread over the other
// data centers, so that a client under its limit behind one Envoy got about an even third
// of the room and was denied up to a fifth of its requests at three data centers. The
// report's own rate in the snapshot's terms (its requests over its period, times τ) is
// what a steady client's demand would show, and what the lumps show on average; it is
// not the lump itself, which would weigh as five seconds of requests against the others'
// one and take most of the room at each site's own reports.
func withDemand(e *snapshot.Entry, site string, reported float64, buf []topics.SiteCount) (snapshot.Entry, bool) {
	if reported <= 0 {
		return snapshot.Entry{}, false
	}
	i, found := slices.BinarySearchFunc(e.Sites, site, func(c topics.SiteCount, s string) int { return strings.Compare(c.Site, s) })
	if found && e.Sites[i].Demand >= reported {
		return snapshot.Entry{}, false
	}
	own := *e
	own.Sites = append(buf[:0], e.Sites[:i]...)
	if found {
		c := e.Sites[i]
		c.Demand = reported
		own.Sites = append(own.Sites, c)
		i++
	} else {
		own.Sites = append(own.Sites, topics.SiteCount{Site: site, Demand: reported})
	}
	own.Sites = append(own.Sites, e.Sites[i:]...)
	return own, true
}

// arrivalPeriod is the period over which this site's own request rate for a key is
// measured (ms; keyGlobal.arrive): short enough to see a surge within a pipeline lag.
const arrivalPeriod = 500

// arrive counts a request of n at ms (unix ms) and returns this site's request rate for
// the key before it, per ms, over the last one to two periods of arrivalPeriod. Called
// with g.mu held.
func (g *keyGlobal) arrive(ms int64, n int64) float64 {
	slot := ms / arrivalPeriod
	switch {
	case slot == g.arrSlot:
	case slot == g.arrSlot+1:
		g.arrPrev, g.arrCur = g.arrCur, 0
	default:
		g.arrPrev, g.arrCur = 0, 0
	}
	g.arrSlot = slot
	rate := float64(g.arrPrev+g.arrCur) / float64(arrivalPeriod+ms-slot*arrivalPeriod)
	g.arrCur += float32(n)
	return rate
}

// keepFrozen keeps the key's breakdown from before any site went silent: a breakdown e
// seen while every site was fresh becomes the frozen one once every site has stayed fresh
// for hold (SiteStaleAfter) after it was seen, so that the frozen breakdown is never one
// made after a silence began but before it was noticed (the silent site's count then
// already falls as its hits leave the window unseen). While any site is silent it stays
// as it was. Called with g.mu held, at now (unix ms).
func (g *keyGlobal) keepFrozen(now int64, e *snapshot.Entry, known, allFresh bool, hold int64) {
	switch {
	case !allFresh:
		g.cand = nil // it may have been seen after the silence began
	case !known:
	case g.cand == nil:
		g.cand, g.candAt = e.Sites, now
	case now-g.candAt >= hold:
		g.frozen, g.frozenAt = g.cand, g.candAt
		g.cand, g.candAt = e.Sites, now
	}
}

// restarted gives this site's counter what the snapshot shows of this site's hits of a
// key it has no count of while the Engine is younger than the key's window: a site that
// restarted under the same name (a process counting in process) lost its count of the hits
// it admitted before, which the aggregators still count for it, and would otherwise admit
// them again. They are counted as made at the snapshot's as-of time, so that they leave
// the window no sooner than the real ones. The real ones leave sooner, the older of them:
// on every later decision the snapshot tells how many of them are left at most (what it
// counts of this site up to the time it has heard this site up to, less this instance's
// own hits up to then), and the counter forgets the seeded hits beyond that. A counter
// that keeps its counts elsewhere (Redis) is not a seeder and needs none of this.
func (l *Engine) restarted(now time.Time, op *sitecount.Op, e *snapshot.Entry, known bool, st *snapshot.SiteTimes) {
	if !known || now.Sub(l.born) >= op.Window {
		return
	}
	sd, ok := l.cfg.Counter.(seeder)
	if !ok {
		return
	}
	if e.Mine > 0 {
		// A count dated ahead of this clock (by less than the snapshot's MaxCountAhead,
		// which refuses the rest) comes from an aggregator whose clock is ahead: its hits
		// are seeded now, which they were made before.
		sd.Seed(now, op, int64(math.Ceil(e.Mine)), min(e.AsOf, now.UnixMilli()))
	}
	if self, ok := st.Get(l.share.site); ok && !self.Left {
		sd.Reseed(now, op, e.Mine, min(self.Heard, e.AsOf))
	}
}

// seeder is a sitecount.Counter that can be given hits made before it started (sitecount.Local).
type seeder interface {
	// Seed counts n hits of op's key at instant at (unix ms) unless it already counts
	// the key.
	Seed(now time.Time, op *sitecount.Op, n, at int64)
	// Reseed forgets the seeded hits of op's key beyond what the snapshot still counts of
	// them: mine of this site's hits in the window as of t (unix ms), up to which every
	// hit of this site has been counted.
	Reseed(now time.Time, op *sitecount.Op, mine float64, t int64)
}

// Constants of the room ahead (Engine.finalCap), chosen with the accuracy simulation's
// churn and many-process scenarios (docs/accuracy.md).
const (
	// demandTau is τ of the sites' demand in ms, by which a demand is a rate (demand / τ
	// requests per ms).
	demandTau = float64(topics.DemandTimeConstant / time.Millisecond)
	// heavyLoad is the key's demand rate, over its limit's, beyond which the key is in
	// demand beyond its limit: it gets no room ahead, for a window after it was last seen
	// so. At 1 a client near its limit was taken for one beyond it by chance (a burst, the
	// Poisson spread of its requests) and lost the room ahead for a whole window; at 2 the
	// mix's clients under their limit were denied 0.16% of their requests instead of
	// 0.39% (seed 1), no client further over its limit there (docs/accuracy.md).
	heavyLoad = 2.0
	// aheadLead is added to the snapshot's age for how long the other sites go on
	// spending before this site's admissions reach them (ms): about the time from a hit to
	// the other data centers' snapshots less the part the snapshot's age already shows.
	aheadLead = 250
	// aheadMax bounds that time (ms), so that an old snapshot does not leave no room ahead.
	aheadMax = 2000
	// aheadZ is the margin on the other sites' expected spend, in standard deviations of a
	// Poisson count of it.
	aheadZ = 2.0
)

// finalCap makes the corrections of a fresh key's cap that need this site's count as of
// now, on every decision (the allotment a is cached while the snapshot does not change).
// Only a sitecount.Counter that can tell its recent hits (sitecount.Local) is corrected.
//
// Room ahead. The shares split the room among the fresh sites, and follow demand a lag
// late: a client near its limit is refused at one site while room it will not use is kept
// for another. What takes the room from this site is what the other sites spend before
// they see its admissions, not their shares: so a key that is not in demand beyond its
// limit (heavy) may reach, when its share gives less, the whole room less the other fresh
// sites' expected spend within the lag (room.Expected, aheadZ standard deviations of
// margin) — this data center's other sites over the snapshot's age plus aheadLead, the
// other data centers over that plus Config.ReserveMargin — each part at most what the
// shares give them, so that the rule never gives less than the share and, when every site
// keeps back the others' shares, the caps add up to the room. Only this site's hits surely
// in the window count against it: the room ahead is lowered by the part of the oldest
// sub-bucket the span count takes as gone and the hard count does not. A surge at several
// sites before the counts show it is the risk: the other data centers that still serve the
// key (by their rates over Config.ServingSpan), and this data center's other sites, are
// taken to receive at least this site's rate (Engine.cachedCap). A quota spent over a horizon (a Reporter's) gets the
// room ahead within its data center's share only.
//
// Seen as others. This data center's aggregator counts this site's hits a local hop after
// they are made, the other data centers' a replication later: the snapshot shows this site
// fresher than the others see it, and the room it leaves is room the others have already
// spent or will. The cap counts this site as the others see it instead: its exact count
// less its hits since the others' counts were made (the oldest time up to which a fresh
// site of another data center has been heard from). With share f of the room held by the
// other data centers, that moves the cap by f × (seen by others − in the snapshot); a site
// whose data center is alone in the key is not affected. The correction only ever lowers
// the cap: this site's recent hits are told apart within a sub-bucket by the span of its
// hits, an estimate that a burst of admissions moves, and a correction that could rise
// with the admissions it caps would feed on itself. It lowers the share's cap only: in the
// room ahead the others keep back this site's rate instead.
//
// The exact count less the hits since t0 also leaves out this site's hits that left the
// window between t0 and now, which the others still count, as the snapshot does: for
// decisions, a few hundred milliseconds of a steady rate. A Reporter's usage comes in
// lumps a reporting period apart, and with a window of two periods a lump leaves the
// window just as a report arrives, a snapshot's age after t0: the correction took the
// whole lump for unseen hits, and a client at 0.8× its limit behind one Envoy of three
// data centers lost 120 of some 250 requests of room at those reports (denied up to 1.7%
// of its requests over seeds). So a report under the limit's rate (lump) is corrected by
// only the hits that the snapshot counts and the others have not seen. A report at or
// above the limit's rate keeps the whole correction: with one Envoy per data center a
// lump a period long at each data center's turn is the risk, and the whole correction
// held the heavy client at 1.19× the limit where this one let it reach 1.40×.
func (l *Engine) finalCap(now time.Time, op *sitecount.Op, e *snapshot.Entry, known bool, st *snapshot.SiteTimes, a *allotment, horizon time.Duration, lump bool) float64 {
	rc, ok := l.cfg.Counter.(recentCounter)
	if !known || !ok {
		return a.base
	}
	ms := now.UnixMilli()
	t0, heard := l.share.othersHeard(now, st)
	if !heard {
		t0 = ms
	}
	// Hits made in the very millisecond the others were heard up to are taken as unseen:
	// the cap errs low, and a decision at that instant still counts its own admissions.
	count, since, hard := rc.Recent(now, op, t0-1)
	capLocal := a.base
	if heard {
		unseen := min(count-since-e.Mine, 0)
		if lump {
			// Only the hits the snapshot counts and the others have not seen: those
			// after t0 up to the snapshot's as-of time.
			unseen = 0
			if e.AsOf > t0 {
				_, after, _ := rc.Recent(now, op, e.AsOf)
				unseen = min(after-since, 0)
			}
		}
		capLocal += min(a.others, 1) * unseen
	}
	if !a.heavy && a.ahead {
		// This data center's other sites see this site's hits a local hop after they are
		// made; the other data centers a replication later, and the margin is on that.
		lead := min(float64(max(ms-e.AsOf, 0)+aheadLead), aheadMax)
		peers := room.Expected(a.rate, lead, aheadZ)
		remote := room.Expected(a.remote, lead+float64(l.cfg.ReserveMargin.Milliseconds()), aheadZ)
		ahead := math.Floor(a.top - min(remote, a.top-a.dcTop) - min(peers, a.peerShares))
		if horizon > 0 {
			// A quota spent over a horizon (a Reporter's, reported in lumps): the room ahead
			// within this data center only, the other data centers keeping their shares.
			ahead = math.Floor(a.dcTop - room.Expected(a.rate, lead, aheadZ))
		}
		capLocal = max(capLocal, ahead-(hard-count))
	}
	return capLocal
}

// recentCounter is a sitecount.Counter that can tell, of a key's count, the part after an
// instant, and the count with the oldest sub-bucket taken whole (sitecount.Local can).
type recentCounter interface {
	Recent(now time.Time, op *sitecount.Op, t0 int64) (count, since, hard float64)
}

// snapEntry returns the snapshot's entry for h's key, from h's cache while the snapshot
// has not changed since it was filled. The cache saves the snapshot's map lookup, a cache
// miss per decision. A stale result is never returned: Version is read before Get, so an
// Apply racing with the refresh makes the next decision refresh again.
func (l *Engine) snapEntry(sn *snapshot.Snapshot, h *keyHandle) (snapshot.Entry, bool) {
	v := sn.Version()
	g := l.keys.globalOf(h)
	g.mu.Lock()
	defer g.mu.Unlock()
	g.refresh(sn, v, h.key)
	return g.entry, g.known
}

// refresh fills g's copy of key's snapshot entry unless it is already that of sn at
// version v. Version is read by the caller before Get, so that an Apply racing with the
// refresh makes the next decision refresh again. A key the snapshot holds is read again
// through its Ref: the version moves with every count applied to any key, about one per
// report on a busy RLQS server, and a lookup in the snapshot's map at each was a tenth of
// a report's cost. Only a key it did not hold, or no longer holds, is looked up. Called
// with g.mu held.
func (g *keyGlobal) refresh(sn *snapshot.Snapshot, v uint64, key string) {
	if g.snapSet && g.snapFor == sn {
		if g.ver == v {
			return
		}
		if g.known {
			if g.entry, g.known = g.ref.Get(); g.known {
				g.ver = v
				return
			}
		}
	}
	g.ref = sn.Ref(key)
	g.entry, g.known = g.ref.Get()
	g.snapSet, g.snapFor, g.ver = true, sn, v
}

// decideGlobal decides one global limit given this site's count before the request and
// the key's snapshot total.
func (l *Engine) decideGlobal(now time.Time, op *sitecount.Op, allowance int64, local, total float64) algo.Decision {
	used := local + float64(op.N)
	d := algo.Decision{Allowed: used <= op.Cap, Limit: allowance, ResetAfter: op.Window}

	if d.Allowed {
		d.Remaining = int64(math.Floor(op.Cap - used))
	} else {
		d.RetryAfter = l.globalRetry(now, op, float64(allowance), local, max(total, local))
	}
	return d
}

// globalRetry returns how long until op would fit if nothing else changed: when this
// site's own hits leave the window far enough for its count plus N to be within its cap,
// from the buckets of its counter when it can read them (hits leave when their bucket does,
// not evenly). When this site's count alone cannot make room (the other sites hold the
// limit), it estimates from the key's total as if its hits were spread evenly, at least
// one sub-bucket. A request larger than the limit never fits (algo.Never).
func (l *Engine) globalRetry(now time.Time, op *sitecount.Op, allowance, local, total float64) time.Duration {
	if float64(op.N) > allowance {
		return algo.Never
	}
	target := op.Cap - float64(op.N)
	if r, ok := l.cfg.Counter.(retryCounter); ok && target >= 0 {
		if d, ok := r.FallsTo(now, op, target); ok {
			return max(d, time.Millisecond)
		}
	}
	sub := op.Window / time.Duration(l.cfg.SubBuckets)
	excess := local + float64(op.N) - op.Cap
	if total <= 0 || excess <= 0 {
		return sub
	}
	d := time.Duration(excess / total * float64(op.Window))
	return min(max(d, sub, time.Millisecond), op.Window)
}

// commitCounter commits ops to the site counter, and reports whether the counter answered
// from its fallback (sitecount.FallbackReporter).
func (l *Engine) commitCounter(ctx context.Context, now time.Time, ops []sitecount.Op, counts []float64) (ok, fellBack bool, err error) {
	if r, is := l.cfg.Counter.(sitecount.FallbackReporter); is {
		ok, fellBack, err = r.CommitReport(ctx, now, ops, counts)
		if fellBack {
			l.metrics.fallback.WithLabelValues("redis").Inc()
		}
		return ok, fellBack, err
	}
	ok, err = l.cfg.Counter.Commit(ctx, now, ops, counts)
	return ok, false, err
}

func markAll(b []bool) {
	for i := range b {
		b[i] = true
	}
}

// retryCounter is a sitecount.Counter that can tell when its count of a key will have fallen to a
// target if nothing is added (sitecount.Local can; a remote store need not).
type retryCounter interface {
	FallsTo(now time.Time, op *sitecount.Op, target float64) (time.Duration, bool)
}
