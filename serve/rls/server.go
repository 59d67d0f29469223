package rls

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/streamlimit/streamlimit/clock"
	"github.com/streamlimit/streamlimit/enforcer"
	"github.com/streamlimit/streamlimit/enforcer/algo"
	"github.com/streamlimit/streamlimit/enforcer/rules"
	"github.com/streamlimit/streamlimit/serve/headers"
)

// ServiceName is the full gRPC name of the rate limit service, as registered and as
// reported by the health service.
const ServiceName = "envoy.service.ratelimit.v3.RateLimitService"

// Options configures a Server. The zero value is ready to use.
type Options struct {
	// DisableHeaders leaves response_headers_to_add empty. Default false: the RateLimit
	// fields of package headers are added to every response that has a limited descriptor.
	DisableHeaders bool
	// Logger receives a debug record per invalid request and ignored feature. Default: a
	// logger that discards.
	Logger *slog.Logger
	// Registerer receives the Server's metrics; nil registers nothing.
	Registerer prometheus.Registerer
	// Overrides says what a descriptor's own limit does. Default HonourOverrides, as
	// envoyproxy/ratelimit.
	Overrides OverrideMode
	// Compat is whose answers a domain that the rules do not configure gets, and a /json
	// body that is not a request; a configured domain answers as its rules say
	// (rules.Config.Compat). Default rules.DefaultCompat.
	Compat rules.Compat
	// Envoy configures the answers of domains in rules.CompatEnvoy.
	Envoy EnvoyOptions
}

// Server answers ShouldRateLimit with an enforcer.Engine; see docs/rls.md
// for the mapping. It implements rlsv3.RateLimitServiceServer and is safe for simultaneous
// use by multiple goroutines.
type Server struct {
	rlsv3.UnimplementedRateLimitServiceServer

	lim     *enforcer.Engine
	rules   func() *rules.Config
	clock   clock.Clock
	local   *algo.Store
	site    enforcer.SiteStore // nil: site limits are counted in local
	opts    Options
	metrics *metrics
	health  *health.Server
	scratch sync.Pool // *scratch
}

var _ rlsv3.RateLimitServiceServer = (*Server)(nil)

// NewServer returns a Server that decides with l. It fails only when the metrics cannot be
// registered on opts.Registerer.
func NewServer(l *enforcer.Engine, opts Options) (*Server, error) {
	if l == nil {
		return nil, fmt.Errorf("rls: nil Limiter")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	m, err := newMetrics(opts.Registerer)
	if err != nil {
		return nil, fmt.Errorf("rls: %w", err)
	}
	opts.Envoy = opts.Envoy.withDefaults()
	lc := l.Config()
	s := &Server{lim: l, rules: lc.Rules, clock: lc.Clock, local: lc.Local, site: lc.SiteStore, opts: opts, metrics: m, health: health.NewServer()}
	s.scratch.New = func() any { return new(scratch) }
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	s.health.SetServingStatus(ServiceName, healthpb.HealthCheckResponse_SERVING)
	return s, nil
}

// Register registers the rate limit service and the standard gRPC health service
// (grpc.health.v1.Health, SERVING for "" and ServiceName) on gs.
func (s *Server) Register(gs *grpc.Server) {
	rlsv3.RegisterRateLimitServiceServer(gs, s)
	healthpb.RegisterHealthServer(gs, s.health)
}

// SetServing sets the health status of "" and ServiceName to SERVING or NOT_SERVING.
// Call SetServing(false) before GracefulStop so that load balancers stop sending new
// calls while the ones in flight finish.
func (s *Server) SetServing(serving bool) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if serving {
		st = healthpb.HealthCheckResponse_SERVING
	}
	s.health.SetServingStatus("", st)
	s.health.SetServingStatus(ServiceName, st)
}

// scratch is the per-call working memory of ShouldRateLimit, pooled so that mapping the
// request does not allocate once warm. The response is always freshly allocated, since
// gRPC marshals it after ShouldRateLimit returns.
type scratch struct {
	entries []rules.Entry
	descs   [][]rules.Entry
	hits    []int64             // per request descriptor; 0 = not decided (negative hits)
	over    []enforcer.Override // per request descriptor, when any has one in force
	groupOv []enforcer.Override
	index   []int // request descriptor index of each descriptor of the current group
	group   [][]rules.Entry
	res     enforcer.Result // per group
	all     enforcer.Result // whole request
	fields  headers.Values
}

// ShouldRateLimit decides req. It returns InvalidArgument for a malformed request and the
// context's error when ctx is done before the decision; otherwise a response, never an
// error.
func (s *Server) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if err := ctx.Err(); err != nil {
		return nil, status.FromContextError(err).Err()
	}
	if cfg := s.rules(); s.compat(cfg, req.GetDomain()) == rules.CompatEnvoy {
		resp, err := s.envoy(ctx, req, cfg)
		if err == nil {
			s.metrics.observe(enforcerCode(resp.GetOverallCode()))
		}
		return resp, err
	}
	sc := s.scratch.Get().(*scratch)
	defer s.scratch.Put(sc)

	// Map the descriptors; all entries share one backing array.
	descs := req.GetDescriptors()
	n := 0
	for _, d := range descs {
		n += len(d.GetEntries())
	}
	if cap(sc.entries) < n {
		sc.entries = make([]rules.Entry, 0, n)
	}
	sc.entries = sc.entries[:0]
	sc.descs = sc.descs[:0]
	sc.hits = sc.hits[:0]
	sc.over = sc.over[:0]
	var badField error
	reqHits := int64(req.GetHitsAddend())
	if reqHits <= 0 {
		reqHits = 1
	}
	uniform := true
	for _, d := range descs {
		start := len(sc.entries)
		for _, e := range d.GetEntries() {
			sc.entries = append(sc.entries, rules.Entry{Key: e.GetKey(), Value: e.GetValue()})
		}
		sc.descs = append(sc.descs, sc.entries[start:len(sc.entries):len(sc.entries)])
		h := s.descriptorHits(d, reqHits)
		if h > rules.MaxHits && badField == nil {
			badField = &rules.RequestError{Field: "descriptors[" + strconv.Itoa(len(sc.descs)-1) + "].hits_addend",
				Reason: fmt.Sprintf("%d is not in 0..%d", h, int64(rules.MaxHits))}
		}
		if h != reqHits {
			uniform = false
		}
		sc.hits = append(sc.hits, h)
		if lo := d.GetLimit(); lo != nil {
			o, err := s.override(lo, len(sc.descs)-1)
			if err != nil && badField == nil {
				badField = err
			}
			if o.Window > 0 {
				if len(sc.over) == 0 {
					// Every descriptor gets a slot, zero (no override) unless set below.
					sc.over = slices.Grow(sc.over[:0], len(descs))[:len(descs)]
					clear(sc.over)
				}
				sc.over[len(sc.descs)-1] = o
			}
		}
	}

	err := rules.ValidateRequest(req.GetDomain(), sc.descs)
	if err == nil {
		err = badField
	}
	if err != nil {
		s.metrics.invalid.Inc()
		s.opts.Logger.Debug("invalid rate limit request", "err", err)
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	for i := range sc.over {
		if sc.over[i].Window > 0 && sc.hits[i] > 0 {
			s.metrics.overrides.Inc()
		}
	}
	res := &sc.all
	if uniform {
		s.lim.DecideInto(ctx, enforcer.Request{Domain: req.GetDomain(), Descriptors: sc.descs, Hits: reqHits, Overrides: sc.over}, res)
	} else {
		s.decideGroups(ctx, req.GetDomain(), sc)
	}
	s.metrics.observe(res.Code)
	return s.response(res, sc), nil
}

// descriptorHits returns the cost of d: its hits_addend, else the request's; 0 for a
// refund, which is not decided.
func (s *Server) descriptorHits(d *ratelimitv3.RateLimitDescriptor, reqHits int64) int64 {
	if d.GetIsNegativeHits() {
		s.metrics.ignored(featureNegative)
		s.opts.Logger.Debug("negative hits (refund) ignored; the descriptor is not decided")
		return 0
	}
	if h := d.GetHitsAddend(); h != nil {
		v := h.GetValue()
		if v == 0 {
			return 1
		}
		return int64(min(v, math.MaxInt64))
	}
	return reqHits
}

// decideGroups decides the descriptors of sc in groups of equal cost, in order of first
// appearance, and stops at the first group denied. It writes the merged result to sc.all.
func (s *Server) decideGroups(ctx context.Context, domain string, sc *scratch) {
	all := &sc.all
	all.Code = enforcer.CodeOK
	all.Statuses = all.Statuses[:0]
	for range sc.descs {
		all.Statuses = append(all.Statuses, enforcer.Status{Code: enforcer.CodeOK})
	}
	for i, h := range sc.hits {
		if h == 0 || all.Code == enforcer.CodeOverLimit {
			continue
		}
		// First descriptor of a new cost: decide every descriptor of that cost together.
		seen := false
		for _, prev := range sc.hits[:i] {
			if prev == h {
				seen = true
				break
			}
		}
		if seen {
			continue
		}
		sc.index, sc.group, sc.groupOv = sc.index[:0], sc.group[:0], sc.groupOv[:0]
		for j := i; j < len(sc.hits); j++ {
			if sc.hits[j] == h {
				sc.index = append(sc.index, j)
				sc.group = append(sc.group, sc.descs[j])
				if len(sc.over) > 0 {
					sc.groupOv = append(sc.groupOv, sc.over[j])
				}
			}
		}
		s.lim.DecideInto(ctx, enforcer.Request{Domain: domain, Descriptors: sc.group, Hits: h, Overrides: sc.groupOv}, &sc.res)
		for k, j := range sc.index {
			all.Statuses[j] = sc.res.Statuses[k]
		}
		if sc.res.Code == enforcer.CodeOverLimit {
			all.Code = enforcer.CodeOverLimit
		}
	}
}

// statusMsgs are the messages of one descriptor's status, allocated together: its limit
// and duration are only pointed to when the descriptor has a limit.
type statusMsgs struct {
	status rlsv3.RateLimitResponse_DescriptorStatus
	limit  rlsv3.RateLimitResponse_RateLimit
	dur    durationpb.Duration
}

// respMsgs is a response with room for its header fields and for the status of a request
// of one descriptor (the common case), allocated together: one allocation for the whole
// response of a one-descriptor request, besides the header values' one string.
type respMsgs struct {
	resp     rlsv3.RateLimitResponse
	one      [1]statusMsgs
	onePtr   [1]*rlsv3.RateLimitResponse_DescriptorStatus
	hdrs     [headers.MaxFields]corev3.HeaderValue
	hdrsPtrs [headers.MaxFields]*corev3.HeaderValue
}

// response renders res. Its messages are allocated in one block (respMsgs), and for more
// than one descriptor two more (the statuses and their pointers), so that the allocation
// count does not depend on the number of descriptors; the header fields are rendered into
// the scratch's buffer and take one string.
func (s *Server) response(res *enforcer.Result, sc *scratch) *rlsv3.RateLimitResponse {
	m := new(respMsgs)
	out := &m.resp
	out.OverallCode = code(res.Code)
	n := len(res.Statuses)
	var msgs []statusMsgs
	if n == 1 {
		msgs, out.Statuses = m.one[:], m.onePtr[:]
	} else {
		msgs = make([]statusMsgs, n)
		out.Statuses = make([]*rlsv3.RateLimitResponse_DescriptorStatus, n)
	}
	for i := range res.Statuses {
		st := &res.Statuses[i]
		sm := &msgs[i]
		ds := &sm.status
		out.Statuses[i] = ds
		ds.Code = code(st.Code)
		switch {
		case st.Limit != nil:
			lim, d := &sm.limit, &sm.dur
			lim.Name = headers.PolicyName(st)
			lim.RequestsPerUnit = clampU32(st.Requests)
			lim.Unit, lim.UnitMultiplier = unitOf(st.Window)
			ds.CurrentLimit = lim
			ds.LimitRemaining = clampU32(st.Remaining)
			reset := st.ResetAfter
			if st.Code == enforcer.CodeOverLimit {
				reset = st.RetryAfter
			}
			setDuration(d, headers.Cap(reset))
			ds.DurationUntilReset = d
		case st.Rule != nil && st.Rule.Unlimited:
			ds.LimitRemaining = headers.UnlimitedRemaining
		}
	}
	if !s.opts.DisableHeaders {
		if k := sc.fields.Render(res); k > 0 {
			all := string(sc.fields.Bytes())
			for i := range k {
				b, e := sc.fields.Span(i)
				m.hdrs[i].Key, m.hdrs[i].Value = sc.fields.Name(i), all[b:e]
				m.hdrsPtrs[i] = &m.hdrs[i]
			}
			out.ResponseHeadersToAdd = m.hdrsPtrs[:k:k]
		}
	}
	return out
}

func code(c enforcer.Code) rlsv3.RateLimitResponse_Code {
	switch c {
	case enforcer.CodeOK:
		return rlsv3.RateLimitResponse_OK
	case enforcer.CodeOverLimit:
		return rlsv3.RateLimitResponse_OVER_LIMIT
	}
	return rlsv3.RateLimitResponse_UNKNOWN
}

func clampU32(v int64) uint32 {
	return uint32(min(max(v, 0), math.MaxUint32))
}

// setDuration is durationpb.New without the allocation.
func setDuration(d *durationpb.Duration, v time.Duration) {
	v = max(v, 0)
	d.Seconds = int64(v / time.Second)
	d.Nanos = int32(v % time.Second)
}

// unitOf expresses w as the largest Envoy unit that divides it and a multiplier, nil
// when it is 1 (the field's default). A window no unit divides is UNKNOWN.
func unitOf(w time.Duration) (rlsv3.RateLimitResponse_RateLimit_Unit, *wrapperspb.UInt32Value) {
	if w <= 0 {
		return rlsv3.RateLimitResponse_RateLimit_UNKNOWN, nil
	}
	// Envoy's units, largest first, with the durations the rules give them.
	units := [...]struct {
		unit rlsv3.RateLimitResponse_RateLimit_Unit
		d    time.Duration
	}{
		{rlsv3.RateLimitResponse_RateLimit_YEAR, 365 * 24 * time.Hour},
		{rlsv3.RateLimitResponse_RateLimit_MONTH, 30 * 24 * time.Hour},
		{rlsv3.RateLimitResponse_RateLimit_WEEK, 7 * 24 * time.Hour},
		{rlsv3.RateLimitResponse_RateLimit_DAY, 24 * time.Hour},
		{rlsv3.RateLimitResponse_RateLimit_HOUR, time.Hour},
		{rlsv3.RateLimitResponse_RateLimit_MINUTE, time.Minute},
		{rlsv3.RateLimitResponse_RateLimit_SECOND, time.Second},
	}
	for _, u := range units {
		if w%u.d != 0 {
			continue
		}
		m := w / u.d
		switch {
		case m == 1:
			return u.unit, nil
		case m <= math.MaxUint32:
			return u.unit, wrapperspb.UInt32(uint32(m))
		}
	}
	return rlsv3.RateLimitResponse_RateLimit_UNKNOWN, nil
}

// compat returns whose answers domain gets: its rules', else Options.Compat.
func (s *Server) compat(cfg *rules.Config, domain string) rules.Compat {
	if c, ok := cfg.Compat(domain); ok {
		return c
	}
	return s.opts.Compat
}

func enforcerCode(c rlsv3.RateLimitResponse_Code) enforcer.Code {
	if c == rlsv3.RateLimitResponse_OVER_LIMIT {
		return enforcer.CodeOverLimit
	}
	return enforcer.CodeOK
}
