package rlqs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/streamlimit/streamlimit/enforcer"
	"github.com/streamlimit/streamlimit/enforcer/rules"
	"github.com/streamlimit/streamlimit/enforcer/snapshot"
	"github.com/streamlimit/streamlimit/internal/clock"
)

// ServiceName is the full gRPC name of the Rate Limit Quota Service.
const ServiceName = "envoy.service.rate_limit_quota.v3.RateLimitQuotaService"

// Strategy is the rate-limit strategy of the assignments.
type Strategy uint8

const (
	// TokenBucket assigns token buckets: what Envoy's filter enforces.
	TokenBucket Strategy = iota
	// RequestsPerTimeUnit assigns requests_per_time_unit, for clients that enforce it
	// (Envoy's filter does not: it ignores such an assignment, see the package
	// documentation).
	RequestsPerTimeUnit
)

// MaxReportBytes is the largest usage report message a server should accept: Envoy sends
// all its buckets in one message, some 60 bytes each, so 4 MiB holds about 70 000.
const MaxReportBytes = 4 << 20

// Defaults of Options.
const (
	// DefaultTTL is Options.TTL when zero: the snapshot's default staleness bound.
	DefaultTTL = snapshot.DefaultMaxStaleness
	// DefaultReportingInterval is Options.ReportingInterval when zero: the interval at
	// which Envoy's filter reports (it does not yet read reporting_interval from the
	// bucket settings).
	DefaultReportingInterval = 5 * time.Second
	// DefaultAbandonAfter is Options.AbandonAfter when zero.
	DefaultAbandonAfter = 10 * time.Minute
)

// Options configures a Server. The zero value is ready to use.
type Options struct {
	// TTL is every assignment's assignment_time_to_live, rounded up to whole seconds (Envoy
	// reads the seconds only): how long a client that stops hearing from the server keeps
	// deciding on its last assignment. Tie it to the staleness bound of the counts
	// (enforcer/server passes its MaxStaleness): past it the enforcer itself stops trusting
	// the counts the assignment was made from. Default DefaultTTL.
	TTL time.Duration
	// ReportingInterval is how often the clients are assumed to report a bucket until the
	// server has measured it: an assignment is made for the time until the client's next
	// report. Too short an assumption over-admits in a new bucket's first interval, too
	// long one under-admits. Default DefaultReportingInterval.
	ReportingInterval time.Duration
	// Strategy of the assignments. Default TokenBucket.
	Strategy Strategy
	// Unit is the time unit of RequestsPerTimeUnit assignments. Default SECOND.
	Unit typev3.RateLimitUnit
	// AbandonAfter: a bucket whose client reports no request for this long is abandoned
	// (the client forgets it, and reports it again on its next request), so that buckets
	// of clients that went away do not stay reserved. Default DefaultAbandonAfter.
	AbandonAfter time.Duration
	// SiteShare is the part of this site's room that this server hands out: 1 when it is
	// the site's only RLQS server, 1/n when n enforcers of one site (sharing its Redis)
	// serve RLQS, each to its own clients. Default 1.
	SiteShare float64
	// Clock defaults to the wall clock.
	Clock clock.Clock
	// Logger defaults to a logger that discards.
	Logger *slog.Logger
	// Registerer receives the Server's metrics; nil registers nothing.
	Registerer prometheus.Registerer
}

// Server serves StreamRateLimitQuotas from an enforcer.Limiter; see the package
// documentation. It is safe for simultaneous use by multiple goroutines.
type Server struct {
	rlqsv3.UnimplementedRateLimitQuotaServiceServer

	lim     *enforcer.Limiter
	rules   enforcer.RulesSource
	opts    Options
	ttl     time.Duration
	epoch   time.Time
	metrics *metrics
	health  *health.Server
	mapper  atomic.Pointer[mapperFor]
	keys    keyTable

	drainMu  sync.Mutex
	draining []*session
}

// mapperFor is the Mapper of one rules Config.
type mapperFor struct {
	cfg *rules.Config
	m   *Mapper
}

var _ rlqsv3.RateLimitQuotaServiceServer = (*Server)(nil)

// NewServer returns a Server that counts reports in l and assigns from its global limits.
func NewServer(l *enforcer.Limiter, opts Options) (*Server, error) {
	if l == nil {
		return nil, errors.New("rlqs: nil Limiter")
	}
	if opts.TTL <= 0 {
		opts.TTL = DefaultTTL
	}
	if opts.ReportingInterval <= 0 {
		opts.ReportingInterval = DefaultReportingInterval
	}
	if opts.AbandonAfter <= 0 {
		opts.AbandonAfter = DefaultAbandonAfter
	}
	if opts.Unit == typev3.RateLimitUnit_UNKNOWN {
		opts.Unit = typev3.RateLimitUnit_SECOND
	}
	if _, ok := unitDuration(opts.Unit); !ok {
		return nil, fmt.Errorf("rlqs: unit %v is not a time unit", opts.Unit)
	}
	switch {
	case opts.SiteShare == 0:
		opts.SiteShare = 1
	case opts.SiteShare < 0 || opts.SiteShare > 1:
		return nil, fmt.Errorf("rlqs: SiteShare %v is not in (0, 1]", opts.SiteShare)
	}
	opts.Clock = clock.Or(opts.Clock)
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	m, err := newMetrics(opts.Registerer)
	if err != nil {
		return nil, fmt.Errorf("rlqs: %w", err)
	}
	s := &Server{lim: l, rules: l.Config().Rules, opts: opts, metrics: m, health: health.NewServer(), epoch: opts.Clock.Now()}
	// Envoy reads the TTL's whole seconds only: round up, at least one.
	s.ttl = max(time.Duration(math.Ceil(opts.TTL.Seconds()))*time.Second, time.Second)
	s.keys.init()
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	s.health.SetServingStatus(ServiceName, healthpb.HealthCheckResponse_SERVING)
	return s, nil
}

// TTL returns the assignment_time_to_live of the assignments: Options.TTL in whole
// seconds.
func (s *Server) TTL() time.Duration { return s.ttl }

// Register registers the service and the standard gRPC health service on gs.
func (s *Server) Register(gs *grpc.Server) {
	rlqsv3.RegisterRateLimitQuotaServiceServer(gs, s)
	healthpb.RegisterHealthServer(gs, s.health)
}

// SetServing sets the health status of "" and ServiceName.
func (s *Server) SetServing(serving bool) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if serving {
		st = healthpb.HealthCheckResponse_SERVING
	}
	s.health.SetServingStatus("", st)
	s.health.SetServingStatus(ServiceName, st)
}

// Run releases, once a second until ctx ends, the buckets of closed streams whose last
// assignment has expired. It returns nil when ctx ends.
func (s *Server) Run(ctx context.Context) error {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			s.Sweep(s.opts.Clock.Now())
		}
	}
}

// Sweep releases the buckets of closed streams whose last assignment has expired at now:
// until then their clients may still admit on it, and their rates stay reserved.
func (s *Server) Sweep(now time.Time) {
	t := s.since(now)
	s.drainMu.Lock()
	var done []*session
	k := 0
	for _, ss := range s.draining {
		if ss.until <= t {
			done = append(done, ss)
		} else {
			s.draining[k] = ss
			k++
		}
	}
	clear(s.draining[k:])
	s.draining = s.draining[:k]
	s.drainMu.Unlock()
	for _, ss := range done {
		for _, b := range ss.buckets {
			s.metrics.drainingBkts.Dec()
			ss.release(b)
		}
	}
}

// since returns now in seconds since the Server's epoch: the time base of the sums.
func (s *Server) since(now time.Time) float64 { return now.Sub(s.epoch).Seconds() }

// mapperOf returns the Mapper of the rules in force.
func (s *Server) mapperOf(cfg *rules.Config) *Mapper {
	if mf := s.mapper.Load(); mf != nil && mf.cfg == cfg {
		return mf.m
	}
	mf := &mapperFor{cfg: cfg, m: NewMapper(cfg)}
	s.mapper.Store(mf)
	return mf.m
}

// StreamRateLimitQuotas serves one client's stream: each usage report is counted and
// answered with the actions of the buckets whose assignment changed (or is due for
// renewal). It ends with the stream; a report without a domain on a new stream, or with
// another domain than the stream's, ends it with InvalidArgument.
func (s *Server) StreamRateLimitQuotas(stream grpc.BidiStreamingServer[rlqsv3.RateLimitQuotaUsageReports, rlqsv3.RateLimitQuotaResponse]) error {
	ss := s.newSession()
	defer ss.close(s.opts.Clock.Now())
	ctx := stream.Context()
	for {
		msg, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		resp, err := ss.handle(ctx, s.opts.Clock.Now(), msg)
		if err != nil {
			return err
		}
		if resp != nil {
			if err := stream.Send(resp); err != nil {
				return err
			}
		}
	}
}

// minInterval is the shortest time between two reports of a bucket that counts as a
// reporting period (a new bucket's immediate report may be followed at once by a periodic
// one).
const minInterval = 0.05

// session is the server's side of one stream: its domain and its buckets.
type session struct {
	srv     *Server
	domain  string
	buckets map[string]*bucket // by canonical bucket id
	quotas  []enforcer.Quota   // scratch
	until   float64            // once closed: when its last assignment expires
}

// bucket is one bucket of one stream: the holder of its keys' room.
type bucket struct {
	id      *rlqsv3.BucketId
	cfg     *rules.Config // the rules req was mapped with
	req     enforcer.Request
	keys    []*keyState // the global limits' keys, in the order of the quotas
	contrib contribution
	m       model
	started bool
	demand  float64 // requests per second, smoothed
	period  float64 // seconds between reports, measured; 0 until measured
	sentAt  float64
	idle    float64 // since when it reported no request; -1 while active
}

func (s *Server) newSession() *session {
	s.metrics.streams.Inc()
	return &session{srv: s, buckets: map[string]*bucket{}}
}

// handle processes one usage report message at now and returns the response to send, nil
// when no bucket needs an action.
func (ss *session) handle(ctx context.Context, now time.Time, msg *rlqsv3.RateLimitQuotaUsageReports) (*rlqsv3.RateLimitQuotaResponse, error) {
	s := ss.srv
	s.metrics.messages.Inc()
	switch d := msg.GetDomain(); {
	case ss.domain == "" && d == "":
		s.metrics.invalid.WithLabelValues("no_domain").Inc()
		return nil, status.Error(codes.InvalidArgument, "domain: required in a stream's first report")
	case ss.domain == "":
		ss.domain = d
	case d != "" && d != ss.domain:
		s.metrics.invalid.WithLabelValues("domain_changed").Inc()
		return nil, status.Errorf(codes.InvalidArgument, "domain: %q on a stream of domain %q (open a new stream to change it)", d, ss.domain)
	}
	t := s.since(now)
	var resp *rlqsv3.RateLimitQuotaResponse
	for _, u := range msg.GetBucketQuotaUsages() {
		if len(u.GetBucketId().GetBucket()) == 0 {
			s.metrics.invalid.WithLabelValues("no_bucket_id").Inc()
			continue
		}
		s.metrics.reports.Inc()
		s.metrics.allowed.Add(float64(u.GetNumRequestsAllowed()))
		s.metrics.denied.Add(float64(u.GetNumRequestsDenied()))
		id := canonical(u.GetBucketId().GetBucket())
		b := ss.buckets[id]
		if b == nil {
			b = &bucket{id: u.GetBucketId(), idle: -1}
			ss.buckets[id] = b
			s.metrics.buckets.Inc()
		}
		act := ss.report(ctx, now, t, b, u.GetNumRequestsAllowed(), u.GetNumRequestsDenied())
		if act == nil {
			continue
		}
		if act.GetAbandonAction() != nil {
			delete(ss.buckets, id)
			s.metrics.buckets.Dec()
		}
		if resp == nil {
			resp = &rlqsv3.RateLimitQuotaResponse{}
		}
		resp.BucketAction = append(resp.BucketAction, act)
	}
	return resp, nil
}

// report counts one bucket's usage and returns its action, nil when none is due.
func (ss *session) report(ctx context.Context, now time.Time, t float64, b *bucket, allowed, denied uint64) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	s := ss.srv
	if cfg := s.rules(); !b.started || b.cfg != cfg {
		b.cfg = cfg
		b.req = enforcer.Request{Domain: ss.domain, Descriptors: s.mapperOf(cfg).Descriptors(ss.domain, b.id.GetBucket())}
	}
	// The reporting period, measured between reports, is the horizon of the assignment:
	// the client decides on it until its next report. The demand is the requests reported
	// per second, smoothed.
	h := s.opts.ReportingInterval.Seconds()
	span := h
	if b.started {
		dt := t - b.m.last
		if dt >= minInterval {
			if b.period == 0 {
				b.period = dt
			} else {
				b.period = 0.7*b.period + 0.3*min(dt, 4*b.period)
			}
		}
		span = max(dt, minInterval)
	}
	if b.period > 0 {
		h = b.period
	}
	rate := float64(allowed+denied) / span
	if b.started {
		rate = 0.5*b.demand + 0.5*rate
	}
	b.demand = rate
	b.m.afterReport(t, allowed, ss.unit())
	b.started = true

	qs, other := s.lim.Report(ctx, now, b.req, int64(allowed), int64(denied), time.Duration(h*float64(time.Second)), ss.quotas[:0])
	if other > 0 {
		s.metrics.ignoredLimits.Add(float64(other))
	}
	n := 0
	for _, q := range qs {
		if !q.Shadow {
			qs[n] = q
			n++
		}
	}
	qs = qs[:n]
	ss.quotas = qs

	if allowed+denied > 0 {
		b.idle = -1
	} else if b.idle < 0 {
		b.idle = t
	} else if t-b.idle >= s.opts.AbandonAfter.Seconds() {
		ss.release(b)
		s.metrics.abandoned.Inc()
		s.metrics.actions.WithLabelValues("abandon").Inc()
		return &rlqsv3.RateLimitQuotaResponse_BucketAction{BucketId: b.id,
			BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction_{AbandonAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction{}}}
	}

	ss.rekey(b, qs)
	var a assignment
	allotted := math.Inf(1)
	if len(qs) == 0 {
		a = assignment{kind: kindAllow}
	} else {
		atOnce := math.Inf(1)
		for i := range qs {
			k := b.keys[i]
			k.mu.Lock()
			others := contribution{open: k.open - b.contrib.open, demand: k.demand - b.contrib.demand,
				tok: k.tok - b.contrib.tok, rate: k.rate - b.contrib.rate, rateAt: k.rateAt - b.contrib.rateAt}
			k.mu.Unlock()
			now, over := allot(&qs[i], others, t, h, b.demand, others.open+1, s.opts.SiteShare)
			atOnce, allotted = min(atOnce, now), min(allotted, over)
		}
		a = next(b.m, atOnce, allotted, h, s.opts.Strategy == RequestsPerTimeUnit, ss.unit())
	}
	send := ss.due(b, a, allotted, t, h)
	if send && a.kind == kindAllow && b.m.a.kind == kindNone {
		s.metrics.unmatchedBkts.Inc()
	}
	if send {
		b.m.adopt(a)
		b.sentAt = t
	}
	ss.contribute(b, contribution{open: 1, demand: b.demand})
	if !send {
		return nil
	}
	s.metrics.actions.WithLabelValues(strategyLabels[a.kind]).Inc()
	return ss.action(b, a)
}

// due reports whether a, the assignment computed for b, is to be sent: always when b
// has none or another strategy, or its current one could admit more than allotted in the
// next h seconds; when a would admit noticeably more than the current one; and when
// half the TTL has passed since the last one, which the client would otherwise let expire.
func (ss *session) due(b *bucket, a assignment, allotted, t, h float64) bool {
	cur := b.m.a
	switch {
	case cur.kind == kindNone || cur.kind != a.kind:
		return true
	case t-b.sentAt >= ss.srv.ttl.Seconds()/2:
		return true
	case a.kind != kindTokens && a.kind != kindPerUnit:
		return false
	}
	u := ss.unit()
	have := b.m.potential(h, u)
	if have > allotted+1e-9 {
		return true
	}
	probe := b.m
	probe.adopt(a)
	return probe.potential(h, u) > 1.05*have+1
}

// rekey makes b hold the keys of qs, in their order, taking its contribution from keys it
// no longer holds (the rules changed).
func (ss *session) rekey(b *bucket, qs []enforcer.Quota) {
	same := len(b.keys) == len(qs)
	for i := 0; same && i < len(qs); i++ {
		same = b.keys[i].key == qs[i].Key
	}
	if same {
		return
	}
	ss.release(b)
	for i := range qs {
		b.keys = append(b.keys, ss.srv.keys.acquire(qs[i].Key))
	}
}

// contribute replaces b's contribution to its keys with c plus its model's tokens and rate.
func (ss *session) contribute(b *bucket, c contribution) {
	r := b.m.a.rate(ss.unit())
	c.tok, c.rate, c.rateAt = b.m.tok, r, r*b.m.last
	if b.m.a.kind == kindPerUnit {
		c.tok = b.m.potential(0, ss.unit())
	}
	for _, k := range b.keys {
		k.mu.Lock()
		k.add(b.contrib, -1)
		k.add(c, 1)
		k.mu.Unlock()
	}
	b.contrib = c
}

// release takes b's contribution from its keys and lets them go.
func (ss *session) release(b *bucket) {
	for _, k := range b.keys {
		k.mu.Lock()
		k.add(b.contrib, -1)
		k.mu.Unlock()
		ss.srv.keys.release(k)
	}
	b.keys = b.keys[:0]
	b.contrib = contribution{}
}

// close ends the session at now: its buckets stop taking part in shares, but their
// clients may go on admitting on their last assignments until these expire, so their
// tokens and rates stay reserved until then (Sweep).
func (ss *session) close(now time.Time) {
	s := ss.srv
	s.metrics.streams.Dec()
	t := s.since(now)
	ss.until = t
	for _, b := range ss.buckets {
		ss.contribute(b, contribution{})
		if b.m.a.kind != kindNone {
			ss.until = max(ss.until, b.sentAt+s.ttl.Seconds())
		}
		s.metrics.buckets.Dec()
		s.metrics.drainingBkts.Inc()
	}
	s.drainMu.Lock()
	s.draining = append(s.draining, ss)
	s.drainMu.Unlock()
}

func (ss *session) unit() time.Duration {
	d, _ := unitDuration(ss.srv.opts.Unit)
	return d
}

// action renders a as b's bucket action.
func (ss *session) action(b *bucket, a assignment) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	st := &typev3.RateLimitStrategy{}
	switch a.kind {
	case kindAllow:
		st.Strategy = &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_ALLOW_ALL}
	case kindDeny:
		st.Strategy = &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_DENY_ALL}
	case kindTokens:
		st.Strategy = &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
			MaxTokens: a.burst, TokensPerFill: wrapperspb.UInt32(a.fill), FillInterval: durationpb.New(FillInterval)}}
	case kindPerUnit:
		st.Strategy = &typev3.RateLimitStrategy_RequestsPerTimeUnit_{RequestsPerTimeUnit: &typev3.RateLimitStrategy_RequestsPerTimeUnit{
			RequestsPerTimeUnit: uint64(a.burst), TimeUnit: ss.srv.opts.Unit}}
	}
	return &rlqsv3.RateLimitQuotaResponse_BucketAction{BucketId: b.id,
		BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{QuotaAssignmentAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
			AssignmentTimeToLive: durationpb.New(ss.srv.ttl), RateLimitStrategy: st}}}
}

// unitDuration returns the length of an Envoy rate-limit unit (month 30 days, year 365).
func unitDuration(u typev3.RateLimitUnit) (time.Duration, bool) {
	switch u {
	case typev3.RateLimitUnit_SECOND:
		return time.Second, true
	case typev3.RateLimitUnit_MINUTE:
		return time.Minute, true
	case typev3.RateLimitUnit_HOUR:
		return time.Hour, true
	case typev3.RateLimitUnit_DAY:
		return 24 * time.Hour, true
	case typev3.RateLimitUnit_MONTH:
		return 30 * 24 * time.Hour, true
	case typev3.RateLimitUnit_YEAR:
		return 365 * 24 * time.Hour, true
	}
	return 0, false
}

// keyTable holds the keyStates of the keys that some bucket holds, in shards.
type keyTable struct {
	shards [64]keyShard
}

type keyShard struct {
	mu sync.Mutex
	m  map[string]*keyState
}

func (kt *keyTable) init() {
	for i := range kt.shards {
		kt.shards[i].m = map[string]*keyState{}
	}
}

func (kt *keyTable) shard(key string) *keyShard {
	h := uint32(2166136261)
	for i := 0; i < len(key); i++ {
		h = (h ^ uint32(key[i])) * 16777619
	}
	return &kt.shards[h&63]
}

// acquire returns key's state, made if needed, with one more reference.
func (kt *keyTable) acquire(key string) *keyState {
	sh := kt.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	k := sh.m[key]
	if k == nil {
		k = &keyState{key: key}
		sh.m[key] = k
	}
	k.mu.Lock()
	k.refs++
	k.mu.Unlock()
	return k
}

// release drops one reference to k, and k itself with the last.
func (kt *keyTable) release(k *keyState) {
	sh := kt.shard(k.key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	k.mu.Lock()
	k.refs--
	last := k.refs == 0
	k.mu.Unlock()
	if last {
		delete(sh.m, k.key)
	}
}

// len returns the number of keys held.
func (kt *keyTable) len() int {
	n := 0
	for i := range kt.shards {
		kt.shards[i].mu.Lock()
		n += len(kt.shards[i].m)
		kt.shards[i].mu.Unlock()
	}
	return n
}
