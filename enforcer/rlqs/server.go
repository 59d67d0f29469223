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
	"unsafe"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

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

	lim      *enforcer.Limiter
	rules    func() *rules.Config
	opts     Options
	ttl      time.Duration
	epoch    time.Time
	metrics  *metrics
	health   *health.Server
	mapper   atomic.Pointer[mapperFor]
	keys     sharedTable[keyState, *keyState]
	requests sharedTable[request, *request]

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
	s.requests.init()
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	s.health.SetServingStatus(ServiceName, healthpb.HealthCheckResponse_SERVING)
	return s, nil
}

// TTL returns the assignment_time_to_live of the assignments: Options.TTL in whole
// seconds.
func (s *Server) TTL() time.Duration { return s.ttl }

// Register registers the service and the standard gRPC health service on gs, which must
// have been made with ServerOption.
func (s *Server) Register(gs *grpc.Server) {
	gs.RegisterService(&serviceDesc, s)
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
		ss.drain()
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
// another domain than the stream's, ends it with InvalidArgument. Register serves the
// same method from the wire form of the reports instead (wire.go); this one serves it to
// whoever registers the Server with go-control-plane's RegisterRateLimitQuotaServiceServer.
func (s *Server) StreamRateLimitQuotas(stream grpc.BidiStreamingServer[rlqsv3.RateLimitQuotaUsageReports, rlqsv3.RateLimitQuotaResponse]) error {
	var us []usage
	recv := func() (string, []usage, error) {
		msg, err := stream.Recv()
		if err != nil {
			return "", nil, err
		}
		us = usagesOf(msg, us[:0])
		return msg.GetDomain(), us, nil
	}
	send := func(b []byte) error {
		var resp rlqsv3.RateLimitQuotaResponse
		if err := proto.Unmarshal(b, &resp); err != nil {
			return err
		}
		return stream.Send(&resp)
	}
	return s.serve(stream.Context(), recv, send)
}

// usagesOf appends msg's reports to dst.
func usagesOf(msg *rlqsv3.RateLimitQuotaUsageReports, dst []usage) []usage {
	for _, u := range msg.GetBucketQuotaUsages() {
		dst = append(dst, usage{bucket: u.GetBucketId().GetBucket(), allowed: u.GetNumRequestsAllowed(), denied: u.GetNumRequestsDenied()})
	}
	return dst
}

// streamRaw serves the method from the wire form of the reports and responses.
func (s *Server) streamRaw(stream grpc.ServerStream) error {
	var r wireReports
	recv := func() (string, []usage, error) {
		if err := stream.RecvMsg(&r); err != nil {
			return "", nil, err
		}
		if !r.decoded {
			if err := r.decode(); err != nil {
				return "", nil, fmt.Errorf("decoding: %w", err) // InvalidArgument (serve)
			}
			r.decoded = true
		}
		// The domain is compared, and kept, only when it is set: no allocation.
		return unsafeString(r.domain), r.usages, nil
	}
	send := func(b []byte) error {
		w := wireResponse(b)
		return stream.SendMsg(&w)
	}
	return s.serve(stream.Context(), recv, send)
}

// serve runs a session over a stream whose reports recv returns and to which send sends
// responses in wire form.
func (s *Server) serve(ctx context.Context, recv func() (string, []usage, error), send func([]byte) error) error {
	ss := s.newSession()
	defer ss.close(s.opts.Clock.Now())
	for {
		domain, us, err := recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			if st, ok := status.FromError(err); ok && st.Code() != codes.Unknown {
				return err
			}
			s.metrics.invalid.WithLabelValues("malformed").Inc()
			return status.Errorf(codes.InvalidArgument, "usage reports: %v", err)
		}
		resp, err := ss.handle(ctx, s.opts.Clock.Now(), domain, us)
		if err != nil {
			return err
		}
		if resp != nil {
			if err := send(resp); err != nil {
				return err
			}
		}
	}
}

// serviceDesc is the RLQS service with a handler that receives the wire form of reports.
var serviceDesc = grpc.ServiceDesc{
	ServiceName: ServiceName,
	HandlerType: (*rlqsv3.RateLimitQuotaServiceServer)(nil),
	Streams: []grpc.StreamDesc{{
		StreamName:    "StreamRateLimitQuotas",
		Handler:       func(srv any, stream grpc.ServerStream) error { return srv.(*Server).streamRaw(stream) },
		ServerStreams: true,
		ClientStreams: true,
	}},
	Metadata: "envoy/service/rate_limit_quota/v3/rlqs.proto",
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

// unsafeString returns b as a string without copying; the string must not outlive b's
// contents (handle clones what it keeps).
func unsafeString(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// unsafeBytes returns s's bytes without copying, to be read only.
func unsafeBytes(s string) []byte { return unsafe.Slice(unsafe.StringData(s), len(s)) }
