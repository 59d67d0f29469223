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
	"github.com/streamlimit/streamlimit/window"
)

// Publisher publishes the admitted hits of global limits to the hits topic, and the
// requests this site denied (its demand, by which sites share a hot key's room). It must
// never block. *producer.Producer implements it.
type Publisher interface {
	Hit(key string, window time.Duration, n int)
	Denied(key string, window time.Duration, n int)
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
	// SubBuckets is the number of sub-buckets windows are split into, as the aggregators
	// split them. Default window.DefaultSubBuckets.
	SubBuckets int
	// Counter is this site's exact count of global keys. Default: a new LocalCounter with
	// SubBuckets.
	// Several enforcers of one site must share one, in Redis (sitestore.NewCounter), for
	// invariant 3 to hold.
	Counter SiteCounter
	// Snapshot is the view of the counts topic. Default nil: no other site is visible and
	// global limits are always decided on a local share (DefaultShare).
	Snapshot *snapshot.Snapshot
	// Publisher receives every admitted hit of a global limit. Default nil: hits are not
	// published (a single-site setup, or tests).
	Publisher Publisher
	// MinShare is the smallest share of a hot key's room a fresh site may hold, so that a
	// site the snapshot does not show yet — where a client has just arrived — is not shut
	// out for the pipeline's lag. Default DefaultMinShare.
	MinShare float64
	// DefaultShare is a site's share of a global limit for a key the snapshot has never
	// shown, and the share a silent site is assumed to spend (see SiteStaleAfter). Default
	// 0: 1/the number of sites the snapshot's heartbeats list (1 without a snapshot).
	DefaultShare float64
	// ShareDamping holds back part of a hot key's room: a fresh site whose share of the
	// room is f may spend f / (1 + ShareDamping × (1 − f)) of it until the next count. The
	// counts lag the sites' admissions by the pipeline's lag and the shares move with
	// demand between two counts, so a site can have spent a larger share than the next
	// count gives it while the room that count hands the others is partly spent already;
	// the held-back part absorbs that. Near 0 spends the whole room (more over-admission in
	// bursts), 1 holds back the most (more under-admission near the limit); negative turns
	// damping off. Default DefaultShareDamping, chosen with the accuracy simulation
	// (docs/accuracy.md).
	ShareDamping float64
	// DemandPrior spreads a little demand evenly over the fresh sites before the room is
	// shared by demand: each site's weight is (its demand + DemandPrior × limit / n) over
	// (all demand + DemandPrior × limit), for n fresh sites. Without it a site whose demand
	// has just started (a client arriving from another data center) is held to MinShare
	// until its demand has travelled through the pipeline, although the room may be large.
	// Default DefaultDemandPrior; negative: none.
	DemandPrior float64
	// NewKeyHold is how long after a key was last unknown to this site every site is
	// assumed to hold at least its default share of it: the sites spent their default
	// shares while it was unknown, and its first counts may not show that yet. Default
	// DefaultNewKeyHold; negative: none.
	NewKeyHold time.Duration
	// SiteStaleAfter is how long a site may go unheard (its site heartbeats, through the
	// aggregators' heartbeats) before it is assumed to spend its share of every global
	// limit: its hits may be cut off from here (a partition between data centers), and its
	// silence is not idleness. Default DefaultSiteStaleAfter.
	SiteStaleAfter time.Duration
	// RecoveryHold is how long, after the snapshot was last stale, a global limit stays
	// capped at this site's share as well as by the snapshot (bounded by the limit's
	// window): right after Kafka or the aggregator comes back, hits published during the
	// outage are still being delivered and counted, so the first fresh counts are low, and
	// every site would spend the room they seem to leave. Default 30s.
	RecoveryHold time.Duration
	// MaxKeys bounds the counter keys the Limiter interns (its key cache; the counters
	// have their own bounds). A full part of the cache is emptied, which costs only
	// interning the keys again. Default DefaultMaxKeys.
	MaxKeys int
	// KeyCacheBytes bounds the bytes the key cache keeps alive, by an estimate per key;
	// both bounds apply. Default 0: no bound in bytes (see MemoryBudget).
	KeyCacheBytes int64
	// MaxWaiters bounds the requests Await keeps waiting at once. Default
	// DefaultMaxWaiters.
	MaxWaiters int
	// Sleep is how Await waits: until d has passed or ctx is done. Default algo.Sleep, a
	// real timer; simulations pass one that advances their clock.
	Sleep func(ctx context.Context, d time.Duration) error
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
	share   sharing
	keys    keyCache
	metrics *metrics
	scratch sync.Pool // *scratch

	// lastStale is the unix-nanosecond time of the latest decision that found the snapshot
	// stale (0: never), for Config.RecoveryHold.
	lastStale atomic.Int64
	// waiters counts the requests Await keeps waiting.
	waiters atomic.Int64
}

// Defaults of Config.
const (
	// DefaultMinShare is Config.MinShare when zero.
	DefaultMinShare = 0.05
	// DefaultSiteStaleAfter is Config.SiteStaleAfter when zero: three site heartbeat
	// intervals (500 ms), so that a healthy site with replication lag and one late
	// heartbeat is never taken as stale, while a cut site is taken as stale within about
	// a second and a half: until then the sites on both sides of a cut still share the
	// room as if they saw each other, which is what a partition can over-admit.
	DefaultSiteStaleAfter = 1500 * time.Millisecond
	// DefaultNewKeyHold is Config.NewKeyHold when zero: a few pipeline lags.
	DefaultNewKeyHold = time.Second
	// DefaultShareDamping is Config.ShareDamping when zero.
	DefaultShareDamping = 0.15
	// DefaultDemandPrior is Config.DemandPrior when zero.
	DefaultDemandPrior = 0.05
	// DefaultMaxKeys is Config.MaxKeys when zero, and LocalCounterOptions.MaxKeys.
	DefaultMaxKeys = 1 << 20
)

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
	if cfg.SubBuckets <= 0 {
		cfg.SubBuckets = window.DefaultSubBuckets
	}
	if cfg.Counter == nil {
		cfg.Counter = NewLocalCounter(LocalCounterOptions{SubBuckets: cfg.SubBuckets})
	}
	if cfg.MinShare <= 0 {
		cfg.MinShare = DefaultMinShare
	}
	if cfg.DefaultShare < 0 || cfg.DefaultShare > 1 {
		return nil, fmt.Errorf("enforcer: DefaultShare %v is not in [0, 1]", cfg.DefaultShare)
	}
	if cfg.SiteStaleAfter <= 0 {
		cfg.SiteStaleAfter = DefaultSiteStaleAfter
	}
	if cfg.NewKeyHold == 0 {
		cfg.NewKeyHold = DefaultNewKeyHold
	}
	switch {
	case cfg.ShareDamping == 0:
		cfg.ShareDamping = DefaultShareDamping
	case cfg.ShareDamping < 0:
		cfg.ShareDamping = 0
	case cfg.ShareDamping > 1:
		return nil, fmt.Errorf("enforcer: ShareDamping %v is above 1", cfg.ShareDamping)
	}
	switch {
	case cfg.DemandPrior == 0:
		cfg.DemandPrior = DefaultDemandPrior
	case cfg.DemandPrior < 0:
		cfg.DemandPrior = 0
	}
	if cfg.RecoveryHold <= 0 {
		cfg.RecoveryHold = 30 * time.Second
	}
	if cfg.MaxWaiters <= 0 {
		cfg.MaxWaiters = DefaultMaxWaiters
	}
	if cfg.MaxKeys <= 0 {
		cfg.MaxKeys = DefaultMaxKeys
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
	l := &Limiter{cfg: cfg, metrics: m,
		share: sharing{site: cfg.Site, minShare: cfg.MinShare, defaultShare: cfg.DefaultShare, siteStale: cfg.SiteStaleAfter, damping: cfg.ShareDamping, prior: cfg.DemandPrior}}
	l.keys.init(cfg.MaxKeys, cfg.KeyCacheBytes)
	l.scratch.New = func() any { return new(scratch) }
	return l, nil
}

// Config returns the Limiter's configuration with defaults filled in.
func (l *Limiter) Config() Config { return l.cfg }

// KeyCacheBytes returns what the key cache keeps alive, by the estimate
// Config.KeyCacheBytes bounds.
func (l *Limiter) KeyCacheBytes() int64 { return l.keys.bytes() }

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
	// allow is the limit's allowance for this request when it is not the limit's own: an
	// elastic limit's current value, or a pool's share for the request's priority.
	allow int64
	// pooled is set for a pool's operation.
	pooled bool
}

// scratch is the per-call working memory, pooled so that decisions do not allocate.
type scratch struct {
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
	globOps   []GlobalOp
	globRefs  []opRef
	globCount []float64
	globOut   []algo.Decision
	globStale []bool
	globTotal []float64 // the key's total over all sites in the snapshot
	shadowN   []int64   // commitAlgo's saved costs of shadow ops
	oneOp     [1]algo.Op
	oneOut    [1]algo.Decision
	oneGlob   [1]GlobalOp
	// committed says which stages took their quota (commit), for finish's remaining counts.
	committed struct{ site, local, global bool }
	// siteRan says the site stage was asked (commit): otherwise siteOut holds nothing.
	siteRan bool
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
	s.committed.site, s.committed.local, s.committed.global = false, false, false
	s.siteRan = false
}

// DecideInto decides req and writes the result to res, reusing res.Statuses' capacity. It is
// DecideAt at the Limiter's clock's time.
func (l *Limiter) DecideInto(ctx context.Context, req Request, res *Result) {
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
// request takes nothing, and its global keys are published as denied (demand). Errors of
// Redis or Kafka never reach the caller (see the package documentation on degradation);
// ctx bounds the SiteStore call.
func (l *Limiter) DecideAt(ctx context.Context, now time.Time, req Request, res *Result) {
	n := req.Hits
	if n <= 0 {
		n = 1
	}
	s := l.scratch.Get().(*scratch)
	defer l.scratch.Put(s)
	s.reset()
	l.match(req, res, s, n)
	admitted, fused := l.check(ctx, now, s, n)
	admitted, siteFellBack := l.commit(ctx, now, s, n, admitted, fused)
	l.finish(req, res, s, admitted, siteFellBack)
}

// match finds each descriptor's rule and collects the operations of the limits in force,
// by scope, into s; res gets one Status per descriptor.
func (l *Limiter) match(req Request, res *Result, s *scratch, n int64) {
	cfg := l.cfg.Rules()
	res.Code = CodeOK
	res.Statuses = res.Statuses[:0]
	for d, entries := range req.Descriptors {
		var r *rules.Rule
		if cfg != nil {
			r = cfg.Match(req.Domain, entries)
		}
		if len(req.Overrides) > 0 && l.overridden(cfg, req, d, r, s, n) {
			r = nil // the override is in force instead of the rule, which replaces nothing
		}
		s.matched = append(s.matched, r)
		res.Statuses = append(res.Statuses, Status{Code: CodeOK, Rule: r})
	}
	s.active = rules.Active(s.matched, s.active)
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
}

// addOp adds the operation of ref to s, by scope.
func (l *Limiter) addOp(s *scratch, ref opRef, n int64) {
	lim := ref.limit
	switch {
	case lim.Scope == rules.Global:
		s.globOps = append(s.globOps, GlobalOp{Key: ref.key, Window: lim.CountWindow(), N: n, Hard: lim.Hard, h: ref.h})
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
func (l *Limiter) addPool(s *scratch, pl *rules.Pool, desc int, n int64) {
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
	s.globOps = append(s.globOps, GlobalOp{Key: h.key, Window: pl.Limit.Window, N: n, h: h})
	s.globRefs = append(s.globRefs, opRef{desc: desc, limit: &pl.Limit, key: h.key, h: h, allow: allow, pooled: true})
}

// elastic returns an elastic limit's allowance now: from its base up to Elastic.Max while
// its pool, as the snapshot shows it across all sites, has room.
func (l *Limiter) elastic(lim *rules.Limit) int64 {
	used := 0.0
	if sn := l.cfg.Snapshot; sn != nil {
		if e, ok := sn.Get(lim.Pool.Key); ok && e.Window == lim.Pool.Limit.Window {
			used = e.Total / float64(max(lim.Pool.Limit.Algo().Allowance(), 1))
		}
	}
	return lim.Elastic.Requests(lim.Requests, used)
}

// check decides every limit without taking anything: global limits against the snapshot,
// local ones with Peek. A request with only global limits and no shadow rule is checked and
// taken in one Commit instead (fused), and its hits published.
func (l *Limiter) check(ctx context.Context, now time.Time, s *scratch, n int64) (admitted, fused bool) {
	admitted = true
	fused = len(s.globOps) > 0 && len(s.localOps) == 0 && len(s.siteOps) == 0 && !anyShadow(s.globRefs)
	if len(s.globOps) > 0 {
		for i := range s.globOps {
			s.globOps[i].Cap, s.globTotal[i], s.globStale[i] = l.globalCap(now, &s.globOps[i], s.globRefs[i].allowance())
		}
		var err error
		if fused {
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
		} else if err = l.cfg.Counter.Counts(ctx, now, s.globOps, s.globCount); err != nil {
			l.cfg.Logger.Warn("site counter failed; counting this site as zero", "err", err)
			clear(s.globCount)
		}
		for i := range s.globOps {
			s.globOut[i] = l.decideGlobal(now, &s.globOps[i], s.globRefs[i].allowance(), s.globCount[i], s.globTotal[i])
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
	return admitted, fused
}

// commit takes the request's limits when it was admitted, in the order site (one remote
// call), local, global, each atomic over the request's non-shadow limits of its scope, then
// the shadow limits; a denied request publishes its global keys as denied.
func (l *Limiter) commit(ctx context.Context, now time.Time, s *scratch, n int64, admitted, fused bool) (ok, siteFellBack bool) {
	if admitted && len(s.siteOps) > 0 {
		admitted, siteFellBack = l.commitAlgo(ctx, now, s, s.siteOps, s.siteRefs, s.siteOut, true)
		s.committed.site, s.siteRan = admitted, true
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
	} else if l.cfg.Publisher != nil {
		// The request's global keys were in demand here: publish it, so that the sites
		// share the keys' room toward where their clients are now.
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
func (l *Limiter) finish(req Request, res *Result, s *scratch, admitted, siteFellBack bool) {
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
	l.report(res, s.localRefs, s.localOut, nil)
	if s.siteRan {
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
		// A race between check and commit denied the request (see the package doc);
		// report the descriptors of the stage that refused it.
		res.Code = CodeOverLimit
	}
	l.metrics.observe(req.Domain, res)
}

// commitAlgo takes the non-shadow ops of one scope atomically. Shadow ops are left for
// commitShadow.
func (l *Limiter) commitAlgo(ctx context.Context, now time.Time, s *scratch, ops []algo.Op, refs []opRef, out []algo.Decision, site bool) (ok, fellBack bool) {
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

// globalCap computes one global limit's cap on this site's count (for Commit) from the
// snapshot, with the key's total over all sites in the snapshot, and whether the decision
// is a fallback: the snapshot is stale and the limit is decided on a local share, or a
// remote site is silent and assumed to spend its share.
func (l *Limiter) globalCap(now time.Time, op *GlobalOp, allow int64) (capLocal, total float64, fallback bool) {
	allowance := float64(allow)
	sn := l.cfg.Snapshot
	if sn == nil {
		return dither(allowance*l.share.staleShare(nil, false, nil), op.Key, now.Unix()), 0, true
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
	if h := op.h; h != nil && !stale {
		capLocal, total, fallback, e, known, _ = l.cachedCap(now, op, h, sn, st, allowance)
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
		capLocal, fallback, _ = l.share.capFor(now, op.Key, allowance, &e, known, false, st)
	}
	if last := l.lastStale.Load(); last != 0 && now.UnixNano()-last < int64(min(op.Window, l.cfg.RecoveryHold)) {
		// Recovering from an outage: the fresh counts may still miss hits published
		// during it; each site also keeps to its share, which sum to the limit.
		capLocal = min(capLocal, dither(allowance*l.share.staleShare(&e, known, st), op.Key, salt(&e, known, now)))
	}
	return capLocal, total, fallback
}

// usable reports whether snapshot entry e counts op's counter at now: a count for another
// window is another counter, and one whose window has passed since its as-of time
// describes hits that are gone (the aggregator tombstones such keys, but not while no
// instance owns them).
func usable(e *snapshot.Entry, op *GlobalOp, now time.Time) bool {
	return e.Window == op.Window && !e.Expired(now)
}

// salt is what rounds a cap: the count's as-of time, else the second.
func salt(e *snapshot.Entry, known bool, now time.Time) int64 {
	if known {
		return e.AsOf
	}
	return now.Unix()
}

// capKey is everything a global cap depends on besides the Limiter's fixed settings.
type capKey struct {
	ver    uint64              // the snapshot's Version when the entry was read
	sites  *snapshot.SiteTimes // the site freshness in force
	stale  uint64              // which of sites' sites are stale (bit i: Sites()[i])
	allow  float64
	known  bool
	newKey bool
	salt   int64
}

// capCache is a key's last global cap and what it was computed from.
type capCache struct {
	key      capKey
	set      bool
	cap      float64
	fallback bool
	raw      float64 // the cap before seenAsOthers
	f        float64 // this site's share of the room
}

// cachedCap is the cap of a fresh snapshot's key through its handle: the entry from the
// handle's cache while the snapshot has not changed, and the cap itself while nothing it
// depends on has (the entry, the site freshness, which sites are stale, the allowance, the
// rounding salt). A hot key's decision then costs a few comparisons instead of the whole
// share computation. ok is false when the caller must return cap, total and fallback as
// they are (never, for now: kept for symmetry with the stale path).
func (l *Limiter) cachedCap(now time.Time, op *GlobalOp, h *keyHandle, sn *snapshot.Snapshot, st *snapshot.SiteTimes, allowance float64) (capLocal, total float64, fallback bool, e snapshot.Entry, known, ok bool) {
	v := sn.Version()
	bits, cacheable := l.share.staleBits(now, st)
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
	newKey := known && now.UnixNano()-g.unknownAt < int64(l.cfg.NewKeyHold)
	k := capKey{ver: v, sites: st, stale: bits, allow: allowance, known: known, newKey: newKey, salt: salt(&e, known, now)}
	if cacheable && g.cc.set && g.cc.key == k {
		return l.seenAsOthers(now, op, &e, known, st, g.cc.raw, g.cc.f), total, g.cc.fallback, e, known, true
	}
	var f float64
	capLocal, fallback, f = l.share.capFor(now, op.Key, allowance, &e, known, newKey, st)
	raw := capLocal
	capLocal = l.seenAsOthers(now, op, &e, known, st, capLocal, f)
	g.cc = capCache{key: k, set: cacheable, cap: capLocal, fallback: fallback, raw: raw, f: f}
	return capLocal, total, fallback, e, known, true
}

// seenAsOthers corrects a fresh key's cap for the lag between this site's view of itself
// and the other sites' view of it. This data center's aggregator counts this site's hits
// a local hop after they are made, the other sites' a replication later: the snapshot shows
// this site fresher than the others see it, and the room it leaves is room the others have
// already spent or will. The cap counts this site as the others see it instead: its exact
// count less its hits since the others' counts were made (the oldest time up to which a
// fresh remote site has been heard from). With share f of the room, that moves the cap by
// (1 − f) × (seen by others − in the snapshot); a site alone in the key (f = 1) is not
// affected. The correction only ever lowers the cap: this site's recent hits are told
// apart within a sub-bucket by the span of its hits, an estimate that a burst of admissions
// moves, and a correction that could rise with the admissions it caps would feed on
// itself. It is made on every decision, with this site's count as of now. Only a
// SiteCounter that can tell its recent hits (LocalCounter) is corrected.
func (l *Limiter) seenAsOthers(now time.Time, op *GlobalOp, e *snapshot.Entry, known bool, st *snapshot.SiteTimes, capLocal, f float64) float64 {
	if !known || f <= 0 || f >= 1 {
		return capLocal
	}
	rc, ok := l.cfg.Counter.(recentCounter)
	if !ok {
		return capLocal
	}
	t0, ok := l.share.othersHeard(now, st)
	if !ok {
		return capLocal
	}
	// Hits made in the very millisecond the others were heard up to are taken as unseen:
	// the cap errs low, and a decision at that instant still counts its own admissions.
	count, since := rc.recent(now, op, t0-1)
	return capLocal + (1-f)*min(count-since-e.Mine, 0)
}

// recentCounter is a SiteCounter that can tell, of a key's count, the part after an
// instant (LocalCounter can).
type recentCounter interface {
	recent(now time.Time, op *GlobalOp, t0 int64) (count, since float64)
}

// snapEntry returns the snapshot's entry for h's key, from h's cache while the snapshot
// has not changed since it was filled. The cache saves the snapshot's map lookup, a cache
// miss per decision. A stale result is never returned: Version is read before Get, so an
// Apply racing with the refresh makes the next decision refresh again.
func (l *Limiter) snapEntry(sn *snapshot.Snapshot, h *keyHandle) (snapshot.Entry, bool) {
	v := sn.Version()
	g := l.keys.globalOf(h)
	g.mu.Lock()
	defer g.mu.Unlock()
	g.refresh(sn, v, h.key)
	return g.entry, g.known
}

// refresh fills g's copy of key's snapshot entry unless it is already that of sn at
// version v. Version is read by the caller before Get, so that an Apply racing with the
// refresh makes the next decision refresh again. Called with g.mu held.
func (g *keyGlobal) refresh(sn *snapshot.Snapshot, v uint64, key string) {
	if !g.snapSet || g.snapFor != sn || g.ver != v {
		g.entry, g.known = sn.Get(key)
		g.snapSet, g.snapFor, g.ver = true, sn, v
	}
}

// decideGlobal decides one global limit given this site's count before the request and
// the key's snapshot total.
func (l *Limiter) decideGlobal(now time.Time, op *GlobalOp, allowance int64, local, total float64) algo.Decision {
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
func (l *Limiter) globalRetry(now time.Time, op *GlobalOp, allowance, local, total float64) time.Duration {
	if float64(op.N) > allowance {
		return algo.Never
	}
	target := op.Cap - float64(op.N)
	if r, ok := l.cfg.Counter.(retryCounter); ok && target >= 0 {
		if d, ok := r.fallsTo(now, op, target); ok {
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
// from its fallback (FallbackReporter).
func (l *Limiter) commitCounter(ctx context.Context, now time.Time, ops []GlobalOp, counts []float64) (ok, fellBack bool, err error) {
	if r, is := l.cfg.Counter.(FallbackReporter); is {
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

// retryCounter is a SiteCounter that can tell when its count of a key will have fallen to a
// target if nothing is added (LocalCounter can; a remote store need not).
type retryCounter interface {
	fallsTo(now time.Time, op *GlobalOp, target float64) (time.Duration, bool)
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
