package enforcer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/streamlimit/streamlimit/enforcer/algo"
	"github.com/streamlimit/streamlimit/enforcer/rules"
	"github.com/streamlimit/streamlimit/enforcer/snapshot"
	"github.com/streamlimit/streamlimit/internal/clock"
)

// Publisher publishes the admitted hits of global limits to the hits topic. It must never
// block. *producer.Producer implements it.
type Publisher interface {
	Hit(key string, window time.Duration, n int)
}

// SiteStore decides site-scope limits for all enforcers of one site. It never fails: when
// its backend does, it decides in process and reports fellBack. *sitestore.Store
// implements it.
type SiteStore interface {
	AllowAll(ctx context.Context, now time.Time, ops []algo.Op, out []algo.Decision) (allowed, fellBack bool)
}

// RulesSource returns the rules in force; *rules.Reloader's Current is one.
type RulesSource func() *rules.Config

// StaticRules returns a RulesSource that always returns c.
func StaticRules(c *rules.Config) RulesSource { return func() *rules.Config { return c } }

// Config configures a Limiter. Only Rules and Site are required.
type Config struct {
	// Rules returns the rules in force, read once per decision.
	Rules RulesSource
	// Site names this enforcer's site, as in hit records and count breakdowns.
	Site string
	// Local holds the local-scope counters. Default: a new algo.Store with default
	// options.
	Local *algo.Store
	// SiteStore decides site-scope limits. Default: nil, and site-scope limits are
	// decided in Local, as if the site were this process.
	SiteStore SiteStore
	// Counter is this site's exact count of global keys. Default: a new LocalCounter.
	// Several enforcers of one site must share one, in Redis (sitestore.NewCounter), for
	// invariant 3 to hold.
	Counter SiteCounter
	// Snapshot is the view of the counts topic. Default nil: no other site is visible and
	// global limits are always decided on a local share (DefaultShare).
	Snapshot *snapshot.Snapshot
	// Publisher receives every admitted hit of a global limit. Default nil: hits are not
	// published (a single-site setup, or tests).
	Publisher Publisher
	// HotHorizon is added to the pipeline lag when judging whether a global key is hot:
	// a key is hot when the room left in the snapshot is less than its recent rate times
	// (lag + HotHorizon). Default 1s.
	HotHorizon time.Duration
	// HotFraction also makes a key hot when less than this fraction of its limit is left
	// in the snapshot, whatever its rate: a client that just started to exceed its limit at
	// several sites has a recent rate that understates its demand. Default 1: every key
	// with traffic in the snapshot is shared by the sites' recent fractions (the accuracy
	// simulation, docs/accuracy.md, shows that bursts overshoot with anything less).
	HotFraction float64
	// MinShare is the smallest share of a hot key's room a site may spend, so that a site
	// with no recent traffic is not starved. Default 0.05.
	MinShare float64
	// DefaultShare is a site's share of a global limit for a key the snapshot has never
	// shown, used when the snapshot is stale. Set it to 1/number of sites. Default 1.
	DefaultShare float64
	// RecoveryHold is how long, after the snapshot was last stale, a global limit stays
	// capped at this site's share as well as by the snapshot (bounded by the limit's
	// window): right after Kafka or the aggregator comes back, hits published during the
	// outage are still being delivered and counted, so the first fresh counts are low, and
	// every site would spend the room they seem to leave. Default 30s.
	RecoveryHold time.Duration
	// Clock defaults to the wall clock.
	Clock clock.Clock
	// Logger defaults to a logger that discards.
	Logger *slog.Logger
	// Registerer receives the Limiter's metrics; nil registers nothing.
	Registerer prometheus.Registerer
}

// Limiter decides requests against rules of local, site and global scope. See the package
// documentation for the model. Decide and DecideInto are safe for simultaneous use by
// multiple goroutines; DecideInto does not allocate once its keys are known.
type Limiter struct {
	cfg     Config
	keys    keyCache
	metrics *metrics
	scratch sync.Pool // *scratch

	// lastStale is the unix-nanosecond time of the latest decision that found the snapshot
	// stale (0: never), for Config.RecoveryHold.
	lastStale atomic.Int64
}

// New returns a Limiter.
func New(cfg Config) (*Limiter, error) {
	if cfg.Rules == nil {
		return nil, errors.New("enforcer: Config.Rules is required")
	}
	if cfg.Site == "" {
		return nil, errors.New("enforcer: Config.Site is required")
	}
	if cfg.Local == nil {
		cfg.Local = algo.New(algo.Options{})
	}
	if cfg.Counter == nil {
		cfg.Counter = NewLocalCounter(LocalCounterOptions{})
	}
	if cfg.HotHorizon <= 0 {
		cfg.HotHorizon = time.Second
	}
	if cfg.HotFraction <= 0 {
		cfg.HotFraction = 1
	}
	if cfg.MinShare <= 0 {
		cfg.MinShare = 0.05
	}
	if cfg.DefaultShare <= 0 || cfg.DefaultShare > 1 {
		cfg.DefaultShare = 1
	}
	if cfg.RecoveryHold <= 0 {
		cfg.RecoveryHold = 30 * time.Second
	}
	cfg.Clock = clock.Or(cfg.Clock)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("enforcer: %w", err)
	}
	l := &Limiter{cfg: cfg, metrics: m}
	l.keys.init(1 << 20)
	l.scratch.New = func() any { return new(scratch) }
	return l, nil
}

// Config returns the Limiter's configuration with defaults filled in.
func (l *Limiter) Config() Config { return l.cfg }

// Decide decides req. See DecideInto.
func (l *Limiter) Decide(ctx context.Context, req Request) Result {
	var res Result
	l.DecideInto(ctx, req, &res)
	return res
}

// opRef ties a counter operation to the descriptor and limit it came from.
type opRef struct {
	desc   int
	limit  *rules.Limit
	key    string
	h      *keyHandle
	shadow bool
}

// scratch is the per-call working memory, pooled so that decisions do not allocate.
type scratch struct {
	matched []*rules.Rule
	active  []uint64
	buf     []byte

	localOps  []algo.Op
	localRefs []opRef
	localOut  []algo.Decision
	siteOps   []algo.Op
	siteRefs  []opRef
	siteOut   []algo.Decision
	globOps   []GlobalOp
	globRefs  []opRef
	globCount []float64
	globOut   []algo.Decision
	globStale []bool
	globTotal []float64 // the key's total over all sites in the snapshot
	oneOp     [1]algo.Op
	oneOut    [1]algo.Decision
	oneGlob   [1]GlobalOp
}

func (s *scratch) reset() {
	s.matched = s.matched[:0]
	s.localOps, s.localRefs = s.localOps[:0], s.localRefs[:0]
	s.siteOps, s.siteRefs = s.siteOps[:0], s.siteRefs[:0]
	s.globOps, s.globRefs = s.globOps[:0], s.globRefs[:0]
}

// DecideInto decides req and writes the result to res, reusing res.Statuses' capacity.
//
// Each descriptor is matched against the rules of req.Domain (most specific first, as in
// envoyproxy/ratelimit); limits replaced by another matched limit's replaces are not in
// force. The request is admitted only if every limit in force of every non-shadow rule
// admits it; then each takes req.Hits, and each global limit's hits are published. A denied
// request takes nothing. Errors of Redis or Kafka never reach the caller (see the package
// documentation on degradation); ctx bounds the SiteStore call.
func (l *Limiter) DecideInto(ctx context.Context, req Request, res *Result) {
	n := req.Hits
	if n <= 0 {
		n = 1
	}
	now := l.cfg.Clock.Now()
	cfg := l.cfg.Rules()
	s := l.scratch.Get().(*scratch)
	defer l.scratch.Put(s)
	s.reset()

	res.Code = CodeOK
	res.Statuses = res.Statuses[:0]
	for _, entries := range req.Descriptors {
		var r *rules.Rule
		if cfg != nil {
			r = cfg.Match(req.Domain, entries)
		}
		s.matched = append(s.matched, r)
		res.Statuses = append(res.Statuses, Status{Code: CodeOK, Rule: r})
	}
	s.active = rules.Active(s.matched, s.active)

	// Collect the operations, by scope.
	for d, r := range s.matched {
		if r == nil || r.Unlimited {
			continue
		}
		entries := req.Descriptors[d]
		for j := range r.Limits {
			if s.active[d]&(1<<uint(j)) == 0 {
				continue
			}
			lim := &r.Limits[j]
			s.buf = r.AppendKey(s.buf[:0], entries, j)
			h := l.keys.handle(s.buf)
			ref := opRef{desc: d, limit: lim, key: h.key, h: h, shadow: r.ShadowMode}
			switch lim.Scope {
			case rules.Global:
				s.globOps = append(s.globOps, GlobalOp{Key: ref.key, Window: lim.Window, N: n, h: h})
				s.globRefs = append(s.globRefs, ref)
			case rules.Site:
				op := algo.Op{Key: ref.key, Algorithm: lim.Algorithm, Limit: lim.Algo(), N: n}
				if l.cfg.SiteStore == nil {
					s.localOps = append(s.localOps, op)
					s.localRefs = append(s.localRefs, ref)
				} else {
					s.siteOps = append(s.siteOps, op)
					s.siteRefs = append(s.siteRefs, ref)
				}
			default:
				s.localOps = append(s.localOps, algo.Op{Key: ref.key, Algorithm: lim.Algorithm, Limit: lim.Algo(), N: n})
				s.localRefs = append(s.localRefs, ref)
			}
		}
	}
	s.localOut = grow(s.localOut, len(s.localOps))
	s.siteOut = grow(s.siteOut, len(s.siteOps))
	s.globOut = grow(s.globOut, len(s.globOps))
	s.globCount = growF(s.globCount, len(s.globOps))
	s.globStale = growB(s.globStale, len(s.globOps))
	s.globTotal = growF(s.globTotal, len(s.globOps))

	// 1. Check: global limits against the snapshot, local limits with Peek. A request with
	// only global limits and no shadow rule is checked and taken in one Commit instead.
	admitted := true
	fused := len(s.globOps) > 0 && len(s.localOps) == 0 && len(s.siteOps) == 0 && !anyShadow(s.globRefs)
	if len(s.globOps) > 0 {
		for i := range s.globOps {
			s.globOps[i].Cap, s.globTotal[i], s.globStale[i] = l.globalCap(now, &s.globOps[i], s.globRefs[i].limit)
		}
		var err error
		if fused {
			admitted, err = l.cfg.Counter.Commit(ctx, now, s.globOps, s.globCount)
			if err != nil {
				l.cfg.Logger.Warn("site counter failed; admitting on the snapshot alone", "err", err)
				clear(s.globCount)
				admitted = true
			}
		} else if err = l.cfg.Counter.Counts(ctx, now, s.globOps, s.globCount); err != nil {
			l.cfg.Logger.Warn("site counter failed; counting this site as zero", "err", err)
			clear(s.globCount)
		}
		for i := range s.globOps {
			s.globOut[i] = l.decideGlobal(&s.globOps[i], s.globRefs[i].limit, s.globCount[i], s.globTotal[i])
			if !s.globOut[i].Allowed && !s.globRefs[i].shadow {
				admitted = false
			}
		}
		if fused && admitted && l.cfg.Publisher != nil {
			for i := range s.globOps {
				l.cfg.Publisher.Hit(s.globOps[i].Key, s.globOps[i].Window, int(n))
			}
		}
	}
	for i := range s.localOps {
		s.localOut[i] = l.cfg.Local.Peek(now, s.localOps[i])
		if !s.localOut[i].Allowed && !s.localRefs[i].shadow {
			admitted = false
		}
	}

	// 2. Commit, in the order site (one remote call), local, global, each atomic over the
	// request's non-shadow limits of its scope.
	siteFellBack := false
	if admitted && len(s.siteOps) > 0 {
		ok, fb := l.commitAlgo(ctx, now, s.siteOps, s.siteRefs, s.siteOut, true)
		siteFellBack = fb
		admitted = ok
	}
	if admitted && len(s.localOps) > 0 {
		admitted, _ = l.commitAlgo(ctx, now, s.localOps, s.localRefs, s.localOut, false)
	}
	if admitted && len(s.globOps) > 0 && !fused {
		admitted = l.commitGlobal(ctx, now, s, n)
	}
	if admitted {
		l.commitShadow(ctx, now, s)
	}

	// 3. Report: per descriptor, the limit that denied, else the one with least room.
	l.report(res, s.localRefs, s.localOut, nil)
	l.report(res, s.siteRefs, s.siteOut, nil)
	l.report(res, s.globRefs, s.globOut, s.globStale)
	if siteFellBack {
		for _, ref := range s.siteRefs {
			res.Statuses[ref.desc].Fallback = true
		}
	}
	for i := range res.Statuses {
		st := &res.Statuses[i]
		if st.Code == CodeOverLimit {
			res.Code = CodeOverLimit
		}
	}
	if !admitted && res.Code == CodeOK {
		// A race between check and commit denied the request (see the package doc);
		// report the descriptors of the stage that refused it.
		res.Code = CodeOverLimit
	}
	l.metrics.observe(req.Domain, res)
}

// commitAlgo takes the non-shadow ops of one scope atomically. Shadow ops are left for
// commitShadow.
func (l *Limiter) commitAlgo(ctx context.Context, now time.Time, ops []algo.Op, refs []opRef, out []algo.Decision, site bool) (ok, fellBack bool) {
	// Shadow ops must not make the atomic step fail; take them out by asking for 0.
	var shadowN [64]int64
	shadowed := false
	for i := range ops {
		if refs[i].shadow && i < len(shadowN) {
			shadowN[i], ops[i].N = ops[i].N, 0
			shadowed = true
		}
	}
	if site {
		ok, fellBack = l.cfg.SiteStore.AllowAll(ctx, now, ops, out)
		if fellBack {
			l.metrics.fallback.WithLabelValues("redis").Inc()
		}
	} else {
		ok = l.cfg.Local.AllowAll(now, ops, out)
	}
	if shadowed {
		for i := range ops {
			if refs[i].shadow && i < len(shadowN) {
				ops[i].N = shadowN[i]
			}
		}
	}
	if !ok {
		for i := range out[:len(ops)] {
			if refs[i].shadow {
				continue
			}
			out[i].Allowed = out[i].Allowed && out[i].RetryAfter == 0
		}
	}
	return ok, fellBack
}

// commitGlobal takes the non-shadow global ops and publishes their hits.
func (l *Limiter) commitGlobal(ctx context.Context, now time.Time, s *scratch, n int64) bool {
	ops := s.globOps
	// Shadow ops are committed separately so they cannot fail the request.
	k := 0
	for i := range ops {
		if !s.globRefs[i].shadow {
			ops[k], s.globRefs[k], s.globOut[k], s.globCount[k], s.globStale[k] = ops[i], s.globRefs[i], s.globOut[i], s.globCount[i], s.globStale[i]
			k++
		}
	}
	nonShadow := ops[:k]
	ok, err := l.cfg.Counter.Commit(ctx, now, nonShadow, nil)
	if err != nil {
		l.cfg.Logger.Warn("site counter commit failed; admitting on the checked estimate", "err", err)
		ok = true
	}
	if !ok {
		for i := range nonShadow {
			s.globOut[i].Allowed = false
		}
		// Keep the shadow entries after the non-shadow ones for reporting.
		return false
	}
	if l.cfg.Publisher != nil {
		for i := range nonShadow {
			l.cfg.Publisher.Hit(nonShadow[i].Key, nonShadow[i].Window, int(n))
		}
	}
	return true
}

// commitShadow takes the shadow-mode limits of an admitted request, each on its own, so
// that their counters reflect real traffic.
func (l *Limiter) commitShadow(ctx context.Context, now time.Time, s *scratch) {
	for i := range s.localOps {
		if s.localRefs[i].shadow && s.localOut[i].Allowed {
			s.localOut[i] = l.cfg.Local.Allow(now, s.localOps[i])
		}
	}
	for i := range s.siteOps {
		if s.siteRefs[i].shadow {
			s.oneOp[0] = s.siteOps[i]
			l.cfg.SiteStore.AllowAll(ctx, now, s.oneOp[:], s.oneOut[:])
		}
	}
	for i := range s.globOps {
		if s.globRefs[i].shadow && s.globOut[i].Allowed {
			s.oneGlob[0] = s.globOps[i]
			if ok, _ := l.cfg.Counter.Commit(ctx, now, s.oneGlob[:], nil); ok && l.cfg.Publisher != nil {
				l.cfg.Publisher.Hit(s.globOps[i].Key, s.globOps[i].Window, int(s.globOps[i].N))
			}
		}
	}
}

// report folds op decisions into the descriptors' statuses.
func (l *Limiter) report(res *Result, refs []opRef, out []algo.Decision, stale []bool) {
	for i, ref := range refs {
		d := out[i]
		st := &res.Statuses[ref.desc]
		denied := !d.Allowed
		if denied && ref.shadow {
			st.Shadow = true
			l.metrics.shadowDenied(ref.limit, st.Rule)
		}
		replace := st.Limit == nil
		if !replace {
			curDenied := st.RetryAfter > 0
			switch {
			case denied && !curDenied:
				replace = true
			case denied && curDenied:
				replace = d.RetryAfter > st.RetryAfter
			case !denied && !curDenied:
				replace = d.Remaining < st.Remaining
			}
		}
		if replace {
			st.Limit, st.Key = ref.limit, ref.key
			st.Requests, st.Window = d.Limit, ref.limit.Window
			st.Remaining, st.ResetAfter = d.Remaining, d.ResetAfter
			st.RetryAfter = 0
			if denied {
				st.RetryAfter = max(d.RetryAfter, time.Nanosecond)
			}
		}
		if denied && !ref.shadow {
			st.Code = CodeOverLimit
		}
		if stale != nil && stale[i] {
			st.Fallback = true
		}
	}
}

// globalCap computes one global limit's cap on this site's count (for Commit) from the
// snapshot. It also returns the key's total over all sites in the snapshot, and whether
// the limit is decided on a local share because the snapshot is stale.
func (l *Limiter) globalCap(now time.Time, op *GlobalOp, lim *rules.Limit) (capLocal, total float64, stale bool) {
	allowance := float64(lim.Algo().Allowance())
	var (
		e     snapshot.Entry
		known bool
	)
	// cached reports that the key's sharedCap for allowance is cached in the handle.
	var (
		cachedCap float64
		cachedOK  bool
		cached    bool
	)
	stale = true
	if sn := l.cfg.Snapshot; sn != nil {
		stale = sn.StaleAt(now)
		if stale {
			// Written at most once a millisecond: every decision reads it, and a store per
			// decision would bounce its cache line between cores while stale.
			if ns := now.UnixNano(); ns-l.lastStale.Load() > int64(time.Millisecond) {
				l.lastStale.Store(ns)
			}
		}
		if h := op.h; h != nil {
			e, known, cachedCap, cachedOK, cached = l.snapEntry(sn, h, allowance)
		} else {
			e, known = sn.Get(op.Key)
		}
		// A count for another window is another counter; one whose window has passed since
		// its as-of time describes hits that are gone (the aggregator tombstones such keys,
		// but not while no instance owns them).
		if known && (e.Window != op.Window || e.Expired(now)) {
			known = false
		}
	}
	switch {
	case stale:
		capLocal = allowance * l.staleShare(&e, known)
	case known:
		remote := e.Remote()
		capLocal = allowance - remote
		room := allowance - e.Total
		lag := max(now.Sub(e.AsOfTime()), 0)
		rate := e.Total / e.Window.Seconds()
		if room < rate*(lag+l.cfg.HotHorizon).Seconds() || room < l.cfg.HotFraction*allowance {
			c, ok := cachedCap, cachedOK
			if !cached {
				c, ok = l.sharedCap(op.Key, &e, room, allowance)
			}
			if ok {
				// Already rounded together with the other sites (whole, so dither keeps it).
				capLocal = c
			} else {
				share := max(e.Share(), l.cfg.MinShare)
				capLocal = min(capLocal, e.Mine+share*max(room, 0))
			}
		}
	default:
		// A key the fresh snapshot does not show is new, or was idle for a whole window.
		// Every site sees it so until its first hits come back through the pipeline, and
		// would each admit the whole limit: spend only this site's default share until then.
		capLocal = allowance * l.cfg.DefaultShare
	}
	if !stale {
		if last := l.lastStale.Load(); last != 0 && now.UnixNano()-last < int64(min(op.Window, l.cfg.RecoveryHold)) {
			// Recovering from an outage: the fresh counts may still miss hits published
			// during it; each site also keeps to its share, which sum to the limit.
			capLocal = min(capLocal, allowance*l.staleShare(&e, known))
		}
	}
	// Round the same way for every request until the snapshot changes: rounding each
	// request anew would, under heavy demand, round up almost surely (one request admitted
	// at the higher cap is enough), which is rounding up, not dithering.
	salt := now.Unix()
	if known {
		salt = e.AsOf
	}
	capLocal = dither(capLocal, op.Key, salt)
	if known {
		total = e.Total
	}
	return capLocal, total, stale
}

// staleShare is this site's share of a global limit when the snapshot cannot be trusted:
// its last known fraction of the key's traffic (at least MinShare), or DefaultShare for a
// key never seen.
func (l *Limiter) staleShare(e *snapshot.Entry, known bool) float64 {
	if known && e.Total > 0 {
		return max(e.Share(), l.cfg.MinShare)
	}
	return l.cfg.DefaultShare
}

// snapEntry returns the snapshot's entry for h's key, from h's cache while the snapshot
// has not changed since it was filled, and the entry's sharedCap for allowance when cached
// (then cached is true). The cache saves the snapshot's map lookup and the walk over the
// entry's per-site breakdown, two cache misses per decision. A stale result is never
// returned: Version is read before Get, so an Apply racing with the refresh makes the next
// decision refresh again.
func (l *Limiter) snapEntry(sn *snapshot.Snapshot, h *keyHandle, allowance float64) (e snapshot.Entry, known bool, capVal float64, capOK, cached bool) {
	v := sn.Version()
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.snapSet || h.snapFor != sn || h.ver != v {
		h.entry, h.known = sn.Get(h.key)
		h.snapSet, h.snapFor, h.ver = true, sn, v
		h.capAllow = 0
	}
	if h.known && h.entry.Total > 0 && h.capAllow != allowance {
		// sharedCap depends only on the entry, the allowance and the Limiter's fixed
		// configuration, not on the time.
		h.capVal, h.capOK = l.sharedCap(h.key, &h.entry, allowance-h.entry.Total, allowance)
		h.capAllow = allowance
	}
	return h.entry, h.known, h.capVal, h.capOK, h.known && h.entry.Total > 0 && h.capAllow == allowance
}

// shareSmoothing is the weight, in limits, of the prior that every site has
// DefaultShare of a key's traffic: a site's share of a hot key's room is
// (count + k·DefaultShare) / (total + k) with k = shareSmoothing × allowance. Raw
// fractions count/total swing from one snapshot to the next when the window holds few hits
// (the start of a burst), and a site that spent a large share under one snapshot still
// holds it, unseen by the others, when the next one hands the room to another site. The
// accuracy simulation (docs/accuracy.md) chose 1: bursty 10× at 3 sites, 200 ms, worst
// window 1.17 → 1.11 of the limit.
const shareSmoothing = 1

// sharedCap is a hot key's cap when this site appears in the snapshot's breakdown: every
// site s of the breakdown may hold its count there plus its share of the room,
// count_s + share_s × room with share_s as in shareSmoothing (at least MinShare), where
// room = allowance − total may be negative (the window is over the limit; each site then
// gives back its share of the excess instead of keeping all it holds, which would keep the
// window over the limit for good). The fractional caps are rounded together, by systematic
// sampling with one random offset u drawn from the key and the snapshot's as-of time: site
// s gets floor(C_s + c_s + u) − floor(C_s + u), where C_s sums the caps of the sites before
// it in the breakdown's order. Every site computes the same C_s and u from the same record,
// so each cap is rounded up with probability equal to its fraction (the room is spent in
// expectation), and yet the rounded caps add up to the rounded sum: rounding never admits
// more than the limit, as independent rounding of N caps could by up to N−1. It reports
// false when this site is not in the breakdown (it then has no count to keep).
func (l *Limiter) sharedCap(key string, e *snapshot.Entry, room, allowance float64) (float64, bool) {
	if e.Total <= 0 {
		return 0, false
	}
	var before, mine float64
	found := false
	k := shareSmoothing * allowance
	for _, sc := range e.Sites {
		c := sc.Count + max((sc.Count+k*l.cfg.DefaultShare)/(e.Total+k), l.cfg.MinShare)*room
		if sc.Site == l.cfg.Site {
			mine, found = c, true
			break
		}
		before += c
	}
	if !found {
		return 0, false
	}
	u := unitHash(key, e.AsOf)
	return math.Floor(before+mine+u) - math.Floor(before+u), true
}

// decideGlobal decides one global limit given this site's count before the request and
// the key's snapshot total.
func (l *Limiter) decideGlobal(op *GlobalOp, lim *rules.Limit, local, total float64) algo.Decision {
	allowance := lim.Algo().Allowance()
	used := local + float64(op.N)
	d := algo.Decision{Allowed: used <= op.Cap, Limit: allowance, ResetAfter: op.Window}
	if d.Allowed {
		d.Remaining = int64(math.Floor(op.Cap - used))
	} else {
		d.RetryAfter = globalRetry(op, float64(allowance), local, max(total, local))
	}
	return d
}

// globalRetry estimates how long until this site's count falls enough for op to fit,
// assuming the window's hits (total, over all sites) are spread evenly over it.
func globalRetry(op *GlobalOp, allowance, local, total float64) time.Duration {
	if float64(op.N) > allowance {
		return algo.Never
	}
	excess := local + float64(op.N) - op.Cap
	if total <= 0 || excess <= 0 {
		return op.Window / 60
	}
	d := time.Duration(excess / total * float64(op.Window))
	return min(max(d, op.Window/60, time.Millisecond), op.Window)
}

// dither rounds a fractional cap up or down at random, up with probability equal to its
// fraction. Counts are whole, so a cap of 33.4 would otherwise admit 33: with N sites each
// rounding its share of the room down, up to N−1 requests of every window would never be
// admitted. The randomness is a hash of the key and salt (the snapshot's as-of time), so
// that simulations with a virtual clock stay reproducible and no shared random source is
// touched.
func dither(c float64, key string, salt int64) float64 {
	whole := math.Floor(c)
	frac := c - whole
	if frac == 0 {
		return c
	}
	if unitHash(key, salt) < frac {
		return whole + 1
	}
	return whole
}

// unitHash maps (key, salt) to [0, 1), the same on every site.
func unitHash(key string, salt int64) float64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(key); i++ {
		h = (h ^ uint64(key[i])) * 1099511628211
	}
	h ^= uint64(salt)
	// splitmix64 finaliser
	h ^= h >> 30
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 27
	h *= 0x94d049bb133111eb
	h ^= h >> 31
	return float64(h>>11) / (1 << 53)
}

func anyShadow(refs []opRef) bool {
	for i := range refs {
		if refs[i].shadow {
			return true
		}
	}
	return false
}

func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	s = s[:n]
	clear(s)
	return s
}

func growF(s []float64, n int) []float64 { return grow(s, n) }
func growB(s []bool, n int) []bool       { return grow(s, n) }
