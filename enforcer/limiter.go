package enforcer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/streamlimit/streamlimit/clock"
	"github.com/streamlimit/streamlimit/enforcer/algo"
	"github.com/streamlimit/streamlimit/enforcer/rules"
	"github.com/streamlimit/streamlimit/enforcer/sitecount"
	"github.com/streamlimit/streamlimit/enforcer/sitestore"
)

// Engine decides requests against rules of local, site and global scope. See the package
// documentation for the model. Decide and DecideInto are safe for simultaneous use by
// multiple goroutines; DecideInto does not allocate once its keys are known.
type Engine struct {
	cfg     Config
	share   sharing
	keys    keyCache
	metrics *metrics
	scratch sync.Pool // *scratch

	// lastStale is the unix-nanosecond time of the latest decision that found the snapshot
	// stale (0: never), for Config.RecoveryHold.
	lastStale atomic.Int64
	// lastUnknown is the unix-nanosecond time of the last log line about a request of
	// an unknown domain.
	lastUnknown atomic.Int64
	// waiters counts the requests Await keeps waiting.
	waiters atomic.Int64
	// born is when the Engine was made: its site counter has seen no hit before.
	born time.Time
	// denials records recently denied keys (RecentDenials).
	denials denialLog
	// joint is the site counter when it can take a request's global and site limits in
	// one step (the site limits in the same store), else nil.
	joint sitecount.SiteCommitter
	// envoy is the SiteStore when it keeps counters in envoyproxy/ratelimit's layout (the
	// limits rules.Limit.EnvoyShared names), else nil.
	envoy envoyCounter
}

// New returns an Engine.
func New(cfg Config) (*Engine, error) {
	if cfg.Rules == nil {
		return nil, errors.New("enforcer: Config.Rules is required")
	}
	if cfg.Site == "" {
		return nil, errors.New("enforcer: Config.Site is required")
	}
	d := Defaults()
	if cfg.Local == nil {
		cfg.Local = algo.New(algo.Options{})
	}
	if cfg.SubBuckets <= 0 {
		cfg.SubBuckets = d.SubBuckets
	}
	if cfg.Counter == nil {
		cfg.Counter = sitecount.NewLocal(sitecount.LocalOptions{SubBuckets: cfg.SubBuckets})
	}
	if cfg.MinShare <= 0 {
		cfg.MinShare = d.MinShare
	}
	if cfg.DefaultShare < 0 || cfg.DefaultShare > 1 {
		return nil, fmt.Errorf("enforcer: DefaultShare %v is not in [0, 1]", cfg.DefaultShare)
	}
	if cfg.SiteStaleAfter <= 0 {
		cfg.SiteStaleAfter = d.SiteStaleAfter
	}
	if cfg.NewKeyHold == 0 {
		cfg.NewKeyHold = d.NewKeyHold
	}
	switch {
	case cfg.ShareDamping == 0:
		cfg.ShareDamping = d.ShareDamping
	case cfg.ShareDamping < 0:
		cfg.ShareDamping = 0
	case cfg.ShareDamping > 1:
		return nil, fmt.Errorf("enforcer: ShareDamping %v is above 1", cfg.ShareDamping)
	}
	switch {
	case cfg.DemandPrior == 0:
		cfg.DemandPrior = d.DemandPrior
	case cfg.DemandPrior < 0:
		cfg.DemandPrior = 0
	}
	if cfg.RecoveryHold <= 0 {
		cfg.RecoveryHold = d.RecoveryHold
	}
	if cfg.CrashHold == 0 {
		cfg.CrashHold = d.CrashHold
	}
	switch {
	case cfg.ReserveMargin == 0:
		cfg.ReserveMargin = d.ReserveMargin
	case cfg.ReserveMargin < 0:
		cfg.ReserveMargin = 0
	}
	switch {
	case cfg.ServingSpan == 0:
		cfg.ServingSpan = d.ServingSpan
	case cfg.ServingSpan < 0:
		cfg.ServingSpan = 0
	}
	if cfg.MaxWaiters <= 0 {
		cfg.MaxWaiters = d.MaxWaiters
	}
	if cfg.MaxKeys <= 0 {
		cfg.MaxKeys = d.MaxKeys
	}
	if cfg.Sleep == nil {
		cfg.Sleep = algo.Sleep
	}
	cfg.Clock = clock.Or(cfg.Clock)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("enforcer: %w", err)
	}
	l := &Engine{cfg: cfg, metrics: m, born: cfg.Clock.Now(),
		share: sharing{site: cfg.Site, minShare: cfg.MinShare, defaultShare: cfg.DefaultShare, siteStale: cfg.SiteStaleAfter,
			crashHold: cfg.CrashHold, damping: cfg.ShareDamping, prior: cfg.DemandPrior, servingSpan: cfg.ServingSpan.Milliseconds()}}
	if cfg.Registerer != nil {
		sites := &siteStates{l: l, desc: prometheus.NewDesc("streamlimit_enforcer_sites",
			"Sites by the state global decisions take them to be in: fresh, cut (silent with every site of its data center), crashed (silent while others of its data center speak), left.",
			[]string{"state"}, nil)}
		keyBytes := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "streamlimit_enforcer_key_cache_bytes",
			Help: "Bytes the key cache keeps alive, by the estimate Config.KeyCacheBytes (--max-memory) bounds."},
			func() float64 { return float64(l.keys.bytes()) })
		for _, c := range []prometheus.Collector{sites, keyBytes} {
			var are prometheus.AlreadyRegisteredError
			if err := cfg.Registerer.Register(c); err != nil && !errors.As(err, &are) {
				return nil, fmt.Errorf("enforcer: %w", err)
			}
		}
	}
	if j, ok := cfg.Counter.(sitecount.SiteCommitter); ok && cfg.SiteStore != nil {
		l.joint = j
	}
	if e, ok := cfg.SiteStore.(envoyCounter); ok {
		l.envoy = e
	}
	l.keys.init(cfg.MaxKeys, cfg.KeyCacheBytes)
	l.scratch.New = func() any { return new(scratch) }
	return l, nil
}

// Config returns the Engine's configuration with defaults filled in.
func (l *Engine) Config() Config { return l.cfg }

// Decide decides req. See DecideInto.
func (l *Engine) Decide(ctx context.Context, req Request) Result {
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
	// allow is the limit's allowance for this request when it is not the limit's own: an
	// elastic limit's current value, or a pool's share for the request's priority.
	allow int64
	// pooled is set for a pool's operation.
	pooled bool
}

// envoyScratch is the working memory of commitEnvoy.
type envoyScratch struct {
	envoyRefs     []opRef // limits counted in envoyproxy/ratelimit's layout
	envoyIncrs    []sitestore.EnvoyIncr
	envoyCounts   []int64
	envoyOut      []algo.Decision
	envoyFellBack bool
}

// scratch is the per-call working memory, pooled so that decisions do not allocate.
type scratch struct {
	envoyScratch
	matched []*rules.Rule
	active  []uint64
	buf     []byte
	// overPools are the pools of the rules that overrides stood in for, by descriptor:
	// counted once every rule is matched (a pool's share depends on all of them).
	overPools []overPool

	localOps  []algo.Op
	localRefs []opRef
	localOut  []algo.Decision
	siteOps   []algo.Op
	siteRefs  []opRef
	siteOut   []algo.Decision
	globOps   []sitecount.Op
	globRefs  []opRef
	globCount []float64
	globOut   []algo.Decision
	globStale []bool
	globTotal []float64 // the key's total over all sites in the snapshot
	shadowN   []int64   // commitAlgo's saved costs of shadow ops
	oneOp     [1]algo.Op
	oneOut    [1]algo.Decision
	oneGlob   [1]sitecount.Op
	// committed says which stages took their quota (commit), for finish's remaining counts.
	committed struct{ site, local, global bool }
	// siteRan says the site stage is done (commit, or commitJoint with the global stage);
	// siteReported that the store was asked, so siteOut holds its decisions; siteFellBack
	// that commitJoint's site limits were decided in process.
	siteRan, siteReported, siteFellBack bool
}

// overPool is a pool that an overridden descriptor counts toward (scratch.overPools).
type overPool struct {
	desc int
	rule *rules.Rule // the rule the override stood in for, whose priority still holds
	pool *rules.Pool
}

func (s *scratch) reset() {
	s.matched = s.matched[:0]
	s.overPools = s.overPools[:0]
	s.localOps, s.localRefs = s.localOps[:0], s.localRefs[:0]
	s.siteOps, s.siteRefs = s.siteOps[:0], s.siteRefs[:0]
	s.globOps, s.globRefs = s.globOps[:0], s.globRefs[:0]
	s.envoyRefs, s.envoyFellBack = s.envoyRefs[:0], false
	s.committed.site, s.committed.local, s.committed.global = false, false, false
	s.siteRan, s.siteReported, s.siteFellBack = false, false, false
}

// DecideInto decides req and writes the result to res, reusing res.Statuses' capacity. It is
// DecideAt at the Engine's clock's time.
func (l *Engine) DecideInto(ctx context.Context, req Request, res *Result) {
	l.DecideAt(ctx, l.cfg.Clock.Now(), req, res)
}

// DecideAt decides req at instant now and writes the result to res, reusing res.Statuses'
// capacity; like rate.Limiter's AllowN, it is for callers that own the clock. now should
// not go backwards between calls on the same keys.
//
// Each descriptor is matched against the rules of req.Domain (most specific first, as in
// envoyproxy/ratelimit); limits replaced by another matched limit's replaces are not in
// force. The request is admitted only if every limit in force of every non-shadow rule
// admits it; then each takes req.Hits, and each global limit's hits are published. A denied
// request takes nothing (but from the limits of a compat: envoy domain kept in
// envoyproxy/ratelimit's layout, which count every request, as there: see the package
// documentation), and its global keys are published as denied (demand). Errors of
// Redis or Kafka never reach the caller (docs/decisions.md, "Degradation");
// ctx bounds the SiteStore call.
func (l *Engine) DecideAt(ctx context.Context, now time.Time, req Request, res *Result) {
	n := req.Hits
	if n <= 0 {
		n = 1
	}
	s := l.scratch.Get().(*scratch)
	defer l.scratch.Put(s)
	s.reset()
	if known := l.match(req, res, s, n); !known && l.unknownDomain(now, req) && l.cfg.DenyUnknownDomain {
		res.Code = CodeOverLimit
		for i := range res.Statuses {
			res.Statuses[i].Code = CodeOverLimit
		}
		return
	}
	admitted, fused := l.check(ctx, now, s, n, l.commitEnvoy(ctx, now, req, s, n))
	admitted, siteFellBack := l.commit(ctx, now, s, n, admitted, fused)
	l.finish(req, res, s, admitted, siteFellBack)
	if res.Code == CodeOverLimit {
		l.denials.record(now, req.Domain, res)
	}
}

// unknownDomain is called for a request of a domain that the rules in force do not
// configure (match said so). It reports whether the request is to be taken as of an unknown
// domain: unless it brings a limit override of its own. Such a request is counted, and its
// domain logged at most once a second (a client sending a wrong domain sends it with every
// request).
func (l *Engine) unknownDomain(now time.Time, req Request) bool {
	if len(req.Overrides) > 0 {
		return false
	}
	l.metrics.unknownDomain.Inc()
	if ns, last := now.UnixNano(), l.lastUnknown.Load(); ns-last >= int64(time.Second) && l.lastUnknown.CompareAndSwap(last, ns) {
		decision := "allow"
		if l.cfg.DenyUnknownDomain {
			decision = "deny"
		}
		l.cfg.Logger.Warn("request of a domain no rule configures", "domain", req.Domain, "decision", decision)
	}
	return true
}

// match finds each descriptor's rule and collects the operations of the limits in force,
// by scope, into s; res gets one Status per descriptor. It reports whether the rules in
// force configure req's domain (true when no rules are loaded: nothing is unknown then).
func (l *Engine) match(req Request, res *Result, s *scratch, n int64) (known bool) {
	cfg := l.cfg.Rules()
	dom := cfg.Domain(req.Domain)
	res.Code = CodeOK
	res.Statuses = res.Statuses[:0]
	for d, entries := range req.Descriptors {
		r := dom.Match(entries)
		if len(req.Overrides) > 0 && l.overridden(cfg, req, d, r, s, n) {
			r = nil // the override is in force instead of the rule, which replaces nothing
		}
		s.matched = append(s.matched, r)
		res.Statuses = append(res.Statuses, Status{Code: CodeOK, Rule: r})
	}
	s.active = rules.Active(s.matched, s.active)
	envoy := false
	if l.envoy != nil {
		c, _ := cfg.Compat(req.Domain)
		envoy = c == rules.CompatEnvoy
	}
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
			h := l.keys.handle(s.buf, lim.Scope == rules.Global)
			ref := opRef{desc: d, limit: lim, key: h.key, h: h, shadow: r.ShadowMode}
			if envoy && l.envoyShared(lim, bits.OnesCount64(s.active[d]) == 1) {
				s.envoyRefs = append(s.envoyRefs, ref)
				continue
			}
			if lim.Pool != nil {
				if lim.Elastic != nil {
					ref.allow = l.elastic(lim)
				}
				l.addPool(s, lim.Pool, d, n)
			}
			l.addOp(s, ref, n)
		}
	}
	for _, op := range s.overPools {
		l.addPool(s, op.pool, op.desc, n)
	}
	s.localOut = grow(s.localOut, len(s.localOps))
	s.siteOut = grow(s.siteOut, len(s.siteOps))
	s.globOut = grow(s.globOut, len(s.globOps))
	s.globCount = growF(s.globCount, len(s.globOps))
	s.globStale = growB(s.globStale, len(s.globOps))
	s.globTotal = growF(s.globTotal, len(s.globOps))
	return cfg == nil || dom != nil
}

// addOp adds the operation of ref to s, by scope.
func (l *Engine) addOp(s *scratch, ref opRef, n int64) {
	lim := ref.limit
	switch {
	case lim.Scope == rules.Global:
		s.globOps = append(s.globOps, sitecount.Op{Key: ref.key, Window: lim.CountWindow(), N: n, Hard: lim.Hard, Handle: &ref.h.ring})
		s.globRefs = append(s.globRefs, ref)
	case lim.Scope == rules.Site && l.cfg.SiteStore != nil:
		s.siteOps = append(s.siteOps, algo.Op{Key: ref.key, Algorithm: lim.Algorithm, Limit: ref.algoLimit(), N: n})
		s.siteRefs = append(s.siteRefs, ref)
	default: // local, or site scope decided in process when there is no SiteStore
		s.localOps = append(s.localOps, algo.Op{Key: ref.key, Algorithm: lim.Algorithm, Limit: ref.algoLimit(), N: n})
		s.localRefs = append(s.localRefs, ref)
	}
}

// algoLimit is ref's limit in the form package algo takes, with ref's allowance.
func (ref *opRef) algoLimit() algo.Limit {
	a := ref.limit.Algo()
	if ref.allow > 0 {
		a.Requests = ref.allow
	}
	return a
}

// allowance is ref's limit's allowance for this request (soft raise included): for a
// global limit, the count it may reach in its CountWindow.
func (ref *opRef) allowance() int64 {
	switch {
	case ref.pooled:
		return ref.allow
	case ref.allow > 0:
		return ref.algoLimit().Allowance()
	}
	return ref.limit.GlobalAllowance()
}

// addPool adds, once per request, the operation of pool: the request takes one from it
// too, and is refused when requests of its priority have filled their part. The priority
// is the most generous that a matched rule of the request names, the rules that overrides
// stand in for included (a request none of whose rules names one may fill the whole pool).
func (l *Engine) addPool(s *scratch, pl *rules.Pool, desc int, n int64) {
	for i := range s.globRefs {
		if s.globRefs[i].pooled && s.globRefs[i].key == pl.Key {
			return
		}
	}
	fill := -1
	for _, r := range s.matched {
		if r != nil && r.Priority != "" {
			fill = max(fill, pl.Fill(r.Priority))
		}
	}
	for _, op := range s.overPools {
		if op.rule.Priority != "" {
			fill = max(fill, pl.Fill(op.rule.Priority))
		}
	}
	if fill < 0 {
		fill = 100
	}
	allow := pl.Limit.Algo().Allowance() * int64(fill) / 100
	s.buf = append(s.buf[:0], pl.Key...)
	h := l.keys.handle(s.buf, true)
	s.globOps = append(s.globOps, sitecount.Op{Key: h.key, Window: pl.Limit.Window, N: n, Handle: &h.ring})
	s.globRefs = append(s.globRefs, opRef{desc: desc, limit: &pl.Limit, key: h.key, h: h, allow: allow, pooled: true})
}

// elastic returns an elastic limit's allowance now: from its base up to Elastic.Max while
// its pool, as the snapshot shows it across all sites, has room.
func (l *Engine) elastic(lim *rules.Limit) int64 {
	used := 0.0
	if sn := l.cfg.Snapshot; sn != nil {
		if e, ok := sn.Get(lim.Pool.Key); ok && e.Window == lim.Pool.Limit.Window {
			used = e.Total / float64(max(lim.Pool.Limit.Algo().Allowance(), 1))
		}
	}
	return lim.Elastic.Requests(lim.Requests, used)
}

// check decides every limit without taking anything: local ones with Peek, global ones
// against the snapshot and the site counter's counts. A request with global limits and no
// global shadow limit, that its local limits admit, has its global limits checked and taken
// in one Commit instead (fused), and their hits published: one call of the site counter
// instead of two. If it has site limits too, none of them shadow, and the site counter
// keeps its counts in the site limits' store (sitecount.SiteCommitter), the same call
// decides and takes the site limits, all or nothing with the global ones (commitJoint):
// one call instead of three. Its local limits are then taken by commit; if another request
// took their room meanwhile (within that call), the request is refused with its global
// (and site) hits already counted, an error toward refusing, never toward admitting too
// many. admitted is false when commitEnvoy refused the request already: then only the
// counts are asked, as for a request its local limits refuse.
func (l *Engine) check(ctx context.Context, now time.Time, s *scratch, n int64, admitted bool) (_, fused bool) {
	for i := range s.localOps {
		s.localOut[i] = l.cfg.Local.Peek(now, s.localOps[i])
		if !s.localOut[i].Allowed && !s.localRefs[i].shadow {
			admitted = false
		}
	}
	// A request its local limits refuse asks only for the counts, to report its global limits.
	// One with site limits too is fused when the site counter can take both in one step.
	fused = admitted && len(s.globOps) > 0 && !anyShadow(s.globRefs) &&
		(len(s.siteOps) == 0 || l.joint != nil && !anyShadow(s.siteRefs))
	if len(s.globOps) > 0 {
		for i := range s.globOps {
			s.globOps[i].Cap, s.globTotal[i], s.globStale[i] = l.globalCap(now, &s.globOps[i], s.globRefs[i].h, s.globRefs[i].allowance(), 0, 0)
		}
		joint := false
		if fused && len(s.siteOps) > 0 {
			admitted, joint = l.commitJoint(ctx, now, s)
			fused = joint
		}
		var err error
		switch {
		case joint:
			// checked and taken with the site limits
		case fused:
			var fellBack bool
			admitted, fellBack, err = l.commitCounter(ctx, now, s.globOps, s.globCount)
			if fellBack {
				markAll(s.globStale)
			}
			if err != nil {
				l.cfg.Logger.Warn("site counter failed; admitting on the snapshot alone", "err", err)
				clear(s.globCount)
				admitted = true
			}
		default:
			if err = l.cfg.Counter.Counts(ctx, now, s.globOps, s.globCount); err != nil {
				l.cfg.Logger.Warn("site counter failed; counting this site as zero", "err", err)
				clear(s.globCount)
			}
		}
		for i := range s.globOps {
			s.globOut[i] = l.decideGlobal(now, &s.globOps[i], s.globRefs[i].allowance(), s.globCount[i], s.globTotal[i])
			if !s.globOut[i].Allowed {
				// Remaining is the room as it is, since a denied limit takes nothing: what
				// local and site limits report too (Status.Remaining).
				s.globOut[i].Remaining = max(int64(math.Floor(s.globOps[i].Cap-s.globCount[i])), 0)
				if !s.globRefs[i].shadow {
					admitted = false
				}
			}
		}
		if fused && admitted {
			s.committed.global = true
			if l.cfg.Publisher != nil {
				for i := range s.globOps {
					l.cfg.Publisher.Hit(s.globOps[i].Key, s.globOps[i].Window, int(n))
				}
			}
		}
	}
	return admitted, fused
}

// commitJoint checks and takes a request's global and site limits in one call of the site
// counter (sitecount.SiteCommitter), and reports whether it did (done; if not, nothing was
// taken and the request goes through the stages apart) and whether both admitted it.
func (l *Engine) commitJoint(ctx context.Context, now time.Time, s *scratch) (admitted, done bool) {
	j := l.joint.CommitWithSite(ctx, now, l.cfg.SiteStore, s.globOps, s.globCount, s.siteOps, s.siteOut)
	if !j.Done {
		return true, false
	}
	if j.GlobalFellBack {
		markAll(s.globStale)
		l.metrics.fallback.WithLabelValues("redis").Inc()
	}
	if j.SiteFellBack {
		l.metrics.fallback.WithLabelValues("redis").Inc()
	}
	// siteRan marks the site stage as done here, even when the counts refused the request
	// before the site limits were asked (their statuses are then not reported).
	s.siteRan, s.siteReported, s.siteFellBack = true, j.SiteRan, j.SiteFellBack
	s.committed.site = j.Taken
	if j.SiteRan && !j.SiteOK {
		refusedStage(s.siteOut[:len(s.siteOps)])
	}
	return j.Taken, true
}

// commit takes the request's limits when it was admitted, in the order site (one remote
// call), local, global, each atomic over the request's non-shadow limits of its scope, then
// the shadow limits; a denied request publishes its global keys as denied.
func (l *Engine) commit(ctx context.Context, now time.Time, s *scratch, n int64, admitted, fused bool) (ok, siteFellBack bool) {
	siteFellBack = s.siteFellBack
	if admitted && len(s.siteOps) > 0 && !s.siteRan {
		admitted, siteFellBack = l.commitAlgo(ctx, now, s, s.siteOps, s.siteRefs, s.siteOut, true)
		s.committed.site, s.siteRan, s.siteReported = admitted, true, true
	}
	if admitted && len(s.localOps) > 0 {
		admitted, _ = l.commitAlgo(ctx, now, s, s.localOps, s.localRefs, s.localOut, false)
		s.committed.local = admitted
	}
	if admitted && len(s.globOps) > 0 && !fused {
		admitted = l.commitGlobal(ctx, now, s, n)
		s.committed.global = admitted
	}
	if admitted {
		l.commitShadow(ctx, now, s)
	} else if l.cfg.Publisher != nil && !s.committed.global {
		// The request's global keys were in demand here: publish it, so that the sites
		// share the keys' room toward where their clients are now. (A fused request its
		// local limits refused after its global hits were taken published those hits.)
		for i := range s.globOps {
			if !s.globRefs[i].shadow {
				l.cfg.Publisher.Denied(s.globOps[i].Key, s.globOps[i].Window, int(n))
			}
		}
	}
	return admitted, siteFellBack
}

// finish reports, per descriptor, the limit that denied, else the one with least room, and
// the overall code, and counts the decision in the metrics.
func (l *Engine) finish(req Request, res *Result, s *scratch, admitted, siteFellBack bool) {
	if !admitted {
		// Global limits that passed were checked as if the request would take its cost;
		// it took nothing from them unless their stage was committed (local limits are
		// checked with Peek, which reports the room as it is).
		if !s.committed.global {
			for i := range s.globOut {
				if s.globOut[i].Allowed {
					s.globOut[i].Remaining += s.globOps[i].N
				}
			}
		}
	}
	l.report(res, s.envoyRefs, s.envoyOut, nil)
	if s.envoyFellBack {
		for _, ref := range s.envoyRefs {
			res.Statuses[ref.desc].Fallback = true
		}
	}
	l.report(res, s.localRefs, s.localOut, nil)
	if s.siteReported {
		// A request refused before the site stage never asked the store: its site limits
		// are not reported rather than reported as refusing.
		l.report(res, s.siteRefs, s.siteOut, nil)
	}
	l.report(res, s.globRefs, s.globOut, s.globStale)
	if siteFellBack {
		for _, ref := range s.siteRefs {
			res.Statuses[ref.desc].Fallback = true
		}
	}
	for i := range res.Statuses {
		if res.Statuses[i].Code == CodeOverLimit {
			res.Code = CodeOverLimit
		}
	}
	if !admitted && res.Code == CodeOK {
		// A race between check and commit denied the request (docs/decisions.md, "All or nothing");
		// report the descriptors of the stage that refused it.
		res.Code = CodeOverLimit
	}
	l.metrics.observe(req.Domain, res)
}

// commitAlgo takes the non-shadow ops of one scope atomically. Shadow ops are left for
// commitShadow.
func (l *Engine) commitAlgo(ctx context.Context, now time.Time, s *scratch, ops []algo.Op, refs []opRef, out []algo.Decision, site bool) (ok, fellBack bool) {
	// Shadow ops must not make the atomic step fail; take them out by asking for 0.
	s.shadowN = grow(s.shadowN, len(ops))
	shadowN := s.shadowN
	shadowed := false
	for i := range ops {
		if refs[i].shadow {
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
			if refs[i].shadow {
				ops[i].N = shadowN[i]
			}
		}
	}
	if !ok {
		for i := range out[:len(ops)] {
			if !refs[i].shadow {
				refusedStage(out[i : i+1])
			}
		}
	}
	return ok, fellBack
}

// refusedStage marks the decisions of a stage that refused the request as a whole: an op
// that fit on its own is still reported as admitting (it would have, alone) unless it has
// to wait.
func refusedStage(out []algo.Decision) {
	for i := range out {
		out[i].Allowed = out[i].Allowed && out[i].RetryAfter == 0
	}
}

// commitGlobal takes the non-shadow global ops and publishes their hits.
func (l *Engine) commitGlobal(ctx context.Context, now time.Time, s *scratch, n int64) bool {
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
	ok, fellBack, err := l.commitCounter(ctx, now, nonShadow, nil)
	if fellBack {
		markAll(s.globStale[:k])
	}
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
func (l *Engine) commitShadow(ctx context.Context, now time.Time, s *scratch) {
	for i := range s.localOps {
		if s.localRefs[i].shadow && s.localOut[i].Allowed {
			s.localOut[i] = l.cfg.Local.Allow(now, s.localOps[i])
		}
	}
	for i := range s.siteOps {
		if s.siteRefs[i].shadow {
			s.oneOp[0] = s.siteOps[i]
			l.cfg.SiteStore.AllowAll(ctx, now, s.oneOp[:], s.oneOut[:])
			s.siteOut[i] = s.oneOut[0]
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
func (l *Engine) report(res *Result, refs []opRef, out []algo.Decision, stale []bool) {
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
			if ref.limit.Scope == rules.Global {
				st.Window = ref.limit.CountWindow()
			}
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
