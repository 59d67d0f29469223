package rls

import (
	"context"
	"math"
	"math/bits"
	"strconv"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/streamlimit/streamlimit/enforcer"
	"github.com/streamlimit/streamlimit/enforcer/algo"
	"github.com/streamlimit/streamlimit/enforcer/rules"
	"github.com/streamlimit/streamlimit/enforcer/sitestore"
	"github.com/streamlimit/streamlimit/serve/headers"
)

// Default names of the fields that EnvoyOptions.ResponseHeaders adds, as
// envoyproxy/ratelimit names them.
const (
	DefaultLimitHeader     = "RateLimit-Limit"
	DefaultRemainingHeader = "RateLimit-Remaining"
	DefaultResetHeader     = "RateLimit-Reset"
)

// EnvoyOptions are the settings of the answers of a domain in rules.CompatEnvoy:
// envoyproxy/ratelimit's settings of the same meaning, whose environment variables are
// named in parentheses. The zero value is its defaults.
type EnvoyOptions struct {
	// StopIncrementWhenOverLimit (STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT): when a
	// request would take one of its counted limits over, only the limits it takes over
	// count its hits. Default false: every limit of the request counts them, those it
	// takes over too.
	StopIncrementWhenOverLimit bool
	// ResponseHeaders (LIMIT_RESPONSE_HEADERS_ENABLED) adds three fields to
	// response_headers_to_add, for the descriptor closest to its limit (the last one over
	// it, when one is): its requests_per_unit, its limit_remaining and the seconds until
	// its window ends. Default false: response_headers_to_add is empty.
	ResponseHeaders bool
	// LimitHeader (LIMIT_LIMIT_HEADER), RemainingHeader (LIMIT_REMAINING_HEADER) and
	// ResetHeader (LIMIT_RESET_HEADER) name those fields. Defaults DefaultLimitHeader,
	// DefaultRemainingHeader and DefaultResetHeader.
	LimitHeader, RemainingHeader, ResetHeader string
	// QuotaMode (QUOTA_MODE) puts every rule in quota_mode: a descriptor over its limit is
	// answered OK, and its index is listed in the dynamic metadata. Default false: only
	// the rules that say quota_mode: true.
	QuotaMode bool
	// ShadowMode (SHADOW_MODE) answers OK overall whatever the descriptors' codes, which
	// still say OVER_LIMIT. Default false.
	ShadowMode bool
	// DynamicMetadata (RESPONSE_DYNAMIC_METADATA) fills the response's dynamic_metadata:
	// the domain, each descriptor's entries ("key=value"), its limit and hits_addend when
	// set, the request's hits_addend when not 0, the indexes of the descriptors that quota
	// mode admitted over their limit (quotaModeViolations), and whether any rule in force
	// is in quota mode (quotaModeEnabled). Default false: none.
	DynamicMetadata bool
}

func (o EnvoyOptions) withDefaults() EnvoyOptions {
	if o.LimitHeader == "" {
		o.LimitHeader = DefaultLimitHeader
	}
	if o.RemainingHeader == "" {
		o.RemainingHeader = DefaultRemainingHeader
	}
	if o.ResetHeader == "" {
		o.ResetHeader = DefaultResetHeader
	}
	return o
}

// The errors of a request envoyproxy/ratelimit refuses: it answers them with gRPC code
// Unknown and these messages.
const (
	envoyEmptyDomain      = "rate limit domain must not be empty"
	envoyEmptyDescriptors = "rate limit descriptor list must not be empty"
)

// noCeiling is the allowance of the fixed windows that envoyCount counts in: so high that
// every op fits and takes its hits, so that the store adds them as envoyproxy/ratelimit's
// INCRBY does, over the limit or not, and reports the count after them (Limit −
// Remaining). It stays within what the Redis script computes exactly.
const noCeiling = 1 << 50

// How a descriptor of a CompatEnvoy domain is decided.
type envoyKind uint8

const (
	envoyNone      envoyKind = iota // no limit in force: OK
	envoyUnlimited                  // an unlimited rule: OK, limit_remaining 2³²−1
	envoyCounted                    // fixed windows counted as envoyproxy/ratelimit counts
	envoyLimiter                    // streamlimit's extensions: decided by the Limiter
)

// envoyDesc is one descriptor of a request to a CompatEnvoy domain.
type envoyDesc struct {
	kind     envoyKind
	entries  []rules.Entry
	rule     *rules.Rule
	override *rules.Limit // the descriptor's own limit, in force instead of rule
	hits     int64        // 0 only reads
	quota    bool         // its rule is in quota mode

	// The answer, from the limit that speaks for it (over its limit, else the least room).
	limit     *rules.Limit
	requests  int64
	window    time.Duration
	remaining int64
	reset     int64 // whole seconds
	over      bool  // over its limit (shadow_mode included)
}

// envoyOp is one counted limit of a descriptor.
type envoyOp struct {
	desc  int
	limit *rules.Limit
	site  bool // in the SiteStore; else in the Limiter's Local store
	// redisKey, when set, is the limit's counter in envoyproxy/ratelimit's Redis layout
	// (rules.AppendEnvoyKey), counted there by the SiteStore's CountEnvoy, as the Limiter
	// counts it for every other way to ask; expire is its window.
	redisKey string
	expire   time.Duration
}

// envoyCounter is a SiteStore that keeps counters in envoyproxy/ratelimit's own Redis
// layout (*sitestore.Store): CountEnvoy is where the Limiter counts them too.
type envoyCounter interface {
	CountEnvoy(ctx context.Context, now time.Time, incrs []sitestore.EnvoyIncr, out []int64) (fellBack bool)
}

// envoy answers req, whose domain is in rules.CompatEnvoy (or unconfigured, with
// Options.Compat so), as envoyproxy/ratelimit answers it. See docs/rls.md.
func (s *Server) envoy(ctx context.Context, req *rlsv3.RateLimitRequest, cfg *rules.Config) (*rlsv3.RateLimitResponse, error) {
	domain := req.GetDomain()
	switch {
	case domain == "":
		s.metrics.invalid.Inc()
		return nil, status.Error(codes.Unknown, envoyEmptyDomain)
	case len(req.GetDescriptors()) == 0:
		s.metrics.invalid.Inc()
		return nil, status.Error(codes.Unknown, envoyEmptyDescriptors)
	}
	if err := envoyBounds(req); err != nil {
		s.metrics.invalid.Inc()
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	now := s.clock.Now()
	descs := make([]envoyDesc, len(req.GetDescriptors()))
	known := cfg.HasDomain(domain)
	matched := make([]*rules.Rule, len(descs))
	for i, d := range req.GetDescriptors() {
		ed := &descs[i]
		for _, e := range d.GetEntries() {
			ed.entries = append(ed.entries, rules.Entry{Key: e.GetKey(), Value: e.GetValue()})
		}
		ed.hits = envoyHits(req, d)
		if lo := d.GetLimit(); lo != nil && known {
			o, err := s.envoyOverride(lo, i, domain, ed.entries, cfg)
			if err != nil {
				s.metrics.invalid.Inc()
				return nil, status.Error(codes.InvalidArgument, err.Error())
			}
			if o != nil {
				ed.override, ed.kind, ed.quota = o, envoyCounted, s.opts.Envoy.QuotaMode
				s.metrics.overrides.Inc()
				continue
			}
		}
		if known && len(ed.entries) > 0 {
			matched[i] = cfg.Match(domain, ed.entries)
		}
	}
	active := rules.Active(matched, nil)
	for i := range descs {
		ed := &descs[i]
		r := matched[i]
		if ed.kind == envoyCounted || r == nil {
			continue
		}
		ed.rule, ed.quota = r, r.QuotaMode || s.opts.Envoy.QuotaMode
		switch {
		case r.Unlimited:
			ed.kind = envoyUnlimited
		case active[i] == 0:
			ed.kind = envoyNone // every limit of it replaced
		case envoyCountable(r, active[i]):
			ed.kind = envoyCounted
		default:
			ed.kind = envoyLimiter
		}
	}
	s.envoyCount(ctx, now, domain, descs, active)
	s.envoyDecideRest(ctx, now, domain, descs)
	return s.envoyResponse(req, now, descs), nil
}

// envoyBounds applies the bounds of rules.ValidateRequest that keep one request small:
// the number of descriptors and of entries. envoyproxy/ratelimit has none, and accepts
// what ValidateRequest refuses otherwise (descriptors without entries, entries without a
// key), which match no rule.
func envoyBounds(req *rlsv3.RateLimitRequest) error {
	descs := req.GetDescriptors()
	if len(descs) > rules.MaxRequestDescriptors {
		return &rules.RequestError{Field: "descriptors", Reason: strconv.Itoa(len(descs)) + " is more than " + strconv.Itoa(rules.MaxRequestDescriptors)}
	}
	for i, d := range descs {
		if n := len(d.GetEntries()); n > rules.MaxDescriptorEntries {
			return &rules.RequestError{Field: "descriptors[" + strconv.Itoa(i) + "].entries", Reason: strconv.Itoa(n) + " is more than " + strconv.Itoa(rules.MaxDescriptorEntries)}
		}
	}
	return nil
}

// envoyHits is a descriptor's cost as envoyproxy/ratelimit reads it: its own hits_addend
// when set, 0 included (a read that takes nothing), else the request's, 0 meaning 1.
// is_negative_hits is not read, as there.
func envoyHits(req *rlsv3.RateLimitRequest, d *ratelimitv3.RateLimitDescriptor) int64 {
	if h := d.GetHitsAddend(); h != nil {
		return int64(min(h.GetValue(), math.MaxInt64/2))
	}
	return max(int64(req.GetHitsAddend()), 1)
}

// envoyCountable reports whether every limit in force of r (mask) is a fixed window that
// envoyCount can count as envoyproxy/ratelimit counts: in local or site scope, outside
// any pool. Otherwise the rule uses streamlimit's extensions and the Limiter decides it.
func envoyCountable(r *rules.Rule, mask uint64) bool {
	for j := range r.Limits {
		if mask&(1<<uint(j)) == 0 {
			continue
		}
		l := &r.Limits[j]
		if l.Algorithm != algo.FixedWindowOn(l.Algorithm.Calendar()) || l.Scope == rules.Global || l.Pool != nil || l.Elastic != nil {
			return false
		}
	}
	return true
}

// envoyOverride returns the limit that descriptor i's own limit puts in force, as
// envoyproxy/ratelimit builds it: requests_per_unit per unit (unit_multiplier is not
// read there), a fixed window without a name, counted in the site. It returns nil when
// overrides are ignored (Options.Overrides).
func (s *Server) envoyOverride(lo *ratelimitv3.RateLimitDescriptor_RateLimitOverride, i int, domain string, entries []rules.Entry, cfg *rules.Config) (*rules.Limit, error) {
	if s.opts.Overrides == IgnoreOverrides {
		s.metrics.ignored(featureOverride)
		return nil, nil
	}
	unit, ok := overrideUnit(lo.GetUnit())
	if !ok {
		return nil, &rules.RequestError{Field: "descriptors[" + strconv.Itoa(i) + "].limit.unit", Reason: lo.GetUnit().String() + " is not a unit (SECOND, MINUTE, HOUR, DAY, MONTH or YEAR)"}
	}
	w, _ := rules.UnitDuration(unit)
	l := rules.Override(domain, cfg.Match(domain, entries), entries, int64(lo.GetRequestsPerUnit()), w)
	l.Name, l.Algorithm = "", algo.FixedWindow
	if l.Scope != rules.Local {
		l.Scope = rules.Site
	}
	return l, nil
}

// envoyCount counts the counted descriptors' limits as envoyproxy/ratelimit counts its
// fixed windows: each limit adds its descriptor's hits, over the limit or not, and is over
// when its count after them is above the limit. With StopIncrementWhenOverLimit the counts
// are read first, and when the request would take any limit over, only those limits add
// the hits.
func (s *Server) envoyCount(ctx context.Context, now time.Time, domain string, descs []envoyDesc, active []uint64) {
	var refs []envoyOp
	var ops []algo.Op
	var buf []byte
	// ref returns the envoyOp of limit l, with its key in envoyproxy/ratelimit's layout
	// when it is counted there, as the Limiter counts it (rules.Limit.EnvoyShared, with a
	// SiteStore that keeps that layout; own: l is the one limit in force of its
	// descriptor, as every limit of a file written for envoyproxy/ratelimit is; two limits
	// of one rule would share its key).
	_, layout := s.site.(envoyCounter)
	ref := func(i int, l *rules.Limit, r *rules.Rule, own bool) envoyOp {
		op := envoyOp{desc: i, limit: l, site: l.Scope == rules.Site}
		if layout && own && l.EnvoyShared() {
			buf, _ = rules.AppendEnvoyKey(buf[:0], s.lim.Config().EnvoyKeyPrefix, domain, descs[i].entries, r, l, now)
			op.redisKey, op.expire = string(buf), l.Window
		}
		return op
	}
	for i := range descs {
		ed := &descs[i]
		if ed.kind != envoyCounted {
			continue
		}
		if ed.override != nil {
			refs = append(refs, ref(i, ed.override, nil, true))
			buf = rules.AppendOverrideKey(buf[:0], domain, ed.entries, ed.override)
			ops = append(ops, envoyCountOp(string(buf), ed.override, ed.hits))
			continue
		}
		own := bits.OnesCount64(active[i]) == 1
		for j := range ed.rule.Limits {
			if active[i]&(1<<uint(j)) == 0 {
				continue
			}
			l := &ed.rule.Limits[j]
			refs = append(refs, ref(i, l, ed.rule, own))
			buf = ed.rule.AppendKey(buf[:0], ed.entries, j)
			ops = append(ops, envoyCountOp(string(buf), l, ed.hits))
		}
	}
	if len(ops) == 0 {
		return
	}
	out := make([]algo.Decision, len(ops))
	if s.opts.Envoy.StopIncrementWhenOverLimit {
		// Read every count first; if the request takes any limit over, only the limits
		// it takes over count it.
		hits := make([]int64, len(ops))
		for k := range ops {
			hits[k], ops[k].N = ops[k].N, 0
		}
		s.envoyAdd(ctx, now, refs, ops, out)
		over := make([]bool, len(ops))
		anyOver := false
		for k := range ops {
			cur, limit := envoyCountOf(out[k], refs[k].limit)
			over[k] = cur+hits[k] > limit
			anyOver = anyOver || over[k]
		}
		for k := range ops {
			if !anyOver || over[k] {
				ops[k].N = hits[k]
			}
		}
	}
	s.envoyAdd(ctx, now, refs, ops, out)
	for k, ref := range refs {
		ed := &descs[ref.desc]
		after, limit := envoyCountOf(out[k], ref.limit)
		over := after > limit
		remaining := max(limit-after, 0)
		if over {
			remaining = 0
		}
		speaks := ed.limit == nil || (over && !ed.over) || (!ed.over && !over && remaining < ed.remaining)
		if !speaks {
			continue
		}
		ed.limit, ed.over, ed.remaining = ref.limit, over, remaining
		ed.requests, ed.window = ref.limit.Algo().Allowance(), ref.limit.Window
		ed.reset = envoyReset(now, ref.limit)
	}
}

// envoyCountOp is the op that adds hits to limit l's fixed window at key (see noCeiling).
func envoyCountOp(key string, l *rules.Limit, hits int64) algo.Op {
	return algo.Op{Key: key, Algorithm: l.Algorithm, Limit: algo.Limit{Requests: noCeiling, Window: l.Window}, N: hits}
}

// envoyAdd runs ops, each in its limit's store: site ops with a key in
// envoyproxy/ratelimit's layout in that layout, with the SiteStore's CountEnvoy as the
// Limiter's own decisions count them (in process when Redis cannot be reached, written back to the
// same keys), the other site ops in the SiteStore,
// local ones (and site ones when there is no SiteStore) in the Local store. Every op fits (see noCeiling), so each takes
// its N.
func (s *Server) envoyAdd(ctx context.Context, now time.Time, refs []envoyOp, ops []algo.Op, out []algo.Decision) {
	var siteOps, localOps []algo.Op
	var siteAt, localAt, layoutAt []int
	var incrs []sitestore.EnvoyIncr
	for k := range ops {
		switch {
		case refs[k].redisKey != "":
			incrs, layoutAt = append(incrs, sitestore.EnvoyIncr{Key: refs[k].redisKey, N: ops[k].N, Expire: refs[k].expire}), append(layoutAt, k)
		case refs[k].site && s.site != nil:
			siteOps, siteAt = append(siteOps, ops[k]), append(siteAt, k)
		default:
			localOps, localAt = append(localOps, ops[k]), append(localAt, k)
		}
	}
	if len(incrs) > 0 {
		counts := make([]int64, len(incrs))
		s.site.(envoyCounter).CountEnvoy(ctx, now, incrs, counts)
		for i, k := range layoutAt {
			out[k] = algo.Decision{Allowed: true, Limit: noCeiling, Remaining: noCeiling - counts[i]}
		}
	}
	if len(siteOps) > 0 {
		res := make([]algo.Decision, len(siteOps))
		s.site.AllowAll(ctx, now, siteOps, res)
		for i, k := range siteAt {
			out[k] = res[i]
		}
	}
	if len(localOps) > 0 {
		res := make([]algo.Decision, len(localOps))
		s.local.AllowAll(now, localOps, res)
		for i, k := range localAt {
			out[k] = res[i]
		}
	}
}

// envoyCountOf returns the count a store reported in d (see noCeiling) and the limit to
// compare it to. When the store decided on a share of the site's limits (Redis away,
// sitestore's fallback), the limit is scaled by that share too.
func envoyCountOf(d algo.Decision, l *rules.Limit) (count, limit int64) {
	count = d.Limit - d.Remaining
	limit = l.Algo().Allowance()
	if d.Limit != noCeiling && d.Limit > 0 && limit > 0 {
		limit = max(int64(float64(limit)*float64(d.Limit)/noCeiling), 1)
	}
	return count, limit
}

// envoyReset is duration_until_reset as envoyproxy/ratelimit computes it: the whole
// seconds from now (truncated to the second) to the end of l's window.
func envoyReset(now time.Time, l *rules.Limit) int64 {
	sec := now.Unix()
	_, end := algo.FixedBounds(sec*int64(time.Second), l.Window, l.Algorithm.Calendar())
	return end/int64(time.Second) - sec
}

// envoyDecideRest decides the descriptors whose rules use streamlimit's extensions with
// the Limiter, all together, as a Request of streamlimit's (all or nothing among
// themselves), in groups of equal cost; a cost of 0 is taken as 1, since the Limiter
// cannot read without taking.
func (s *Server) envoyDecideRest(ctx context.Context, now time.Time, domain string, descs []envoyDesc) {
	byHits := map[int64][]int{}
	var order []int64
	for i := range descs {
		if descs[i].kind != envoyLimiter {
			continue
		}
		h := max(descs[i].hits, 1)
		if _, ok := byHits[h]; !ok {
			order = append(order, h)
		}
		byHits[h] = append(byHits[h], i)
	}
	var res enforcer.Result
	for _, h := range order {
		idx := byHits[h]
		group := make([][]rules.Entry, len(idx))
		for k, i := range idx {
			group[k] = descs[i].entries
		}
		s.lim.DecideAt(ctx, now, enforcer.Request{Domain: domain, Descriptors: group, Hits: h}, &res)
		for k, i := range idx {
			st := &res.Statuses[k]
			ed := &descs[i]
			if st.Limit == nil {
				ed.kind = envoyNone
				continue
			}
			ed.limit, ed.requests, ed.window = st.Limit, st.Requests, st.Window
			ed.over = st.Code == enforcer.CodeOverLimit || st.Shadow
			ed.remaining = max(st.Remaining, 0)
			wait := st.ResetAfter
			if ed.over {
				ed.remaining, wait = 0, st.RetryAfter
			}
			ed.reset = headers.Seconds(wait)
		}
	}
}

// envoyResponse renders the descriptors' answers as envoyproxy/ratelimit does.
func (s *Server) envoyResponse(req *rlsv3.RateLimitRequest, now time.Time, descs []envoyDesc) *rlsv3.RateLimitResponse {
	out := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(descs))}
	var headersFrom *envoyDesc
	minRemaining := int64(math.MaxUint32)
	var violations []int
	quotaEnabled := false
	for i := range descs {
		ed := &descs[i]
		ds := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
		out.Statuses[i] = ds
		switch ed.kind {
		case envoyUnlimited:
			ds.LimitRemaining = math.MaxUint32
			continue
		case envoyNone:
			continue
		}
		if ed.rule != nil && ed.rule.QuotaMode {
			quotaEnabled = true
		}
		ds.CurrentLimit = &rlsv3.RateLimitResponse_RateLimit{Name: ed.limit.Name, RequestsPerUnit: clampU32(ed.requests)}
		ds.CurrentLimit.Unit, ds.CurrentLimit.UnitMultiplier = unitOf(ed.window)
		ds.LimitRemaining = clampU32(ed.remaining)
		ds.DurationUntilReset = &durationpb.Duration{Seconds: ed.reset}
		shadow := ed.over && ed.rule != nil && ed.rule.ShadowMode
		if ed.over && !shadow {
			ds.Code = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		if ed.kind == envoyCounted && ed.rule != nil {
			s.metrics.envoyDecision(req.GetDomain(), ed.rule.ID, ed.over, shadow, ed.over && !shadow && ed.quota)
		}
		// The descriptor whose fields ResponseHeaders sends: the least remaining, and
		// any over its limit (not in quota mode) before it.
		if int64(ds.LimitRemaining) < minRemaining {
			headersFrom, minRemaining = ed, int64(ds.LimitRemaining)
		}
		if ds.Code == rlsv3.RateLimitResponse_OVER_LIMIT {
			if ed.quota {
				violations = append(violations, i)
				ds.Code, ds.DurationUntilReset = rlsv3.RateLimitResponse_OK, nil
			} else {
				out.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
				headersFrom, minRemaining = ed, 0
			}
		}
	}
	if s.opts.Envoy.ResponseHeaders && headersFrom != nil {
		e := s.opts.Envoy
		out.ResponseHeadersToAdd = []*corev3.HeaderValue{
			{Key: e.LimitHeader, Value: strconv.FormatUint(uint64(clampU32(headersFrom.requests)), 10)},
			{Key: e.RemainingHeader, Value: strconv.FormatInt(minRemaining, 10)},
			{Key: e.ResetHeader, Value: strconv.FormatInt(headersFrom.reset, 10)},
		}
	}
	if out.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT && s.opts.Envoy.ShadowMode {
		out.OverallCode = rlsv3.RateLimitResponse_OK
	}
	if s.opts.Envoy.DynamicMetadata {
		out.DynamicMetadata = envoyMetadata(req, violations, quotaEnabled)
	}
	return out
}

// envoyMetadata is the dynamic_metadata of EnvoyOptions.DynamicMetadata.
func envoyMetadata(req *rlsv3.RateLimitRequest, violations []int, quotaEnabled bool) *structpb.Struct {
	fields := map[string]*structpb.Value{"domain": structpb.NewStringValue(req.GetDomain())}
	descs := make([]*structpb.Value, 0, len(req.GetDescriptors()))
	for _, d := range req.GetDescriptors() {
		entries := make([]*structpb.Value, 0, len(d.GetEntries()))
		for _, e := range d.GetEntries() {
			entries = append(entries, structpb.NewStringValue(e.GetKey()+"="+e.GetValue()))
		}
		f := map[string]*structpb.Value{"entries": structpb.NewListValue(&structpb.ListValue{Values: entries})}
		if lo := d.GetLimit(); lo != nil {
			f["limit"] = structpb.NewStringValue(lo.String())
		}
		if h := d.GetHitsAddend(); h != nil {
			f["hitsAddend"] = structpb.NewNumberValue(float64(h.GetValue()))
		}
		descs = append(descs, structpb.NewStructValue(&structpb.Struct{Fields: f}))
	}
	fields["descriptors"] = structpb.NewListValue(&structpb.ListValue{Values: descs})
	if h := req.GetHitsAddend(); h != 0 {
		fields["hitsAddend"] = structpb.NewNumberValue(float64(h))
	}
	if len(violations) > 0 {
		v := make([]*structpb.Value, len(violations))
		for i, idx := range violations {
			v[i] = structpb.NewNumberValue(float64(idx))
		}
		fields["quotaModeViolations"] = structpb.NewListValue(&structpb.ListValue{Values: v})
	}
	fields["quotaModeEnabled"] = structpb.NewBoolValue(quotaEnabled)
	return &structpb.Struct{Fields: fields}
}
