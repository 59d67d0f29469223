package rlqs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/netip"
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
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
	"google.golang.org/protobuf/proto"

	"github.com/streamlimit/streamlimit/clock"
	"github.com/streamlimit/streamlimit/enforcer"
	"github.com/streamlimit/streamlimit/enforcer/rules"
	"github.com/streamlimit/streamlimit/enforcer/snapshot"
	"github.com/streamlimit/streamlimit/internal/clientaddr"
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
	// DefaultMaxBytes is Options.MaxBytes when zero, for a Server made on its own; the
	// enforcer gives it its part of --max-memory instead (memsize.RLQSPart).
	DefaultMaxBytes = 64 << 20
	// DefaultMaxStreamBuckets is Options.MaxStreamBuckets when zero: an Envoy holds one
	// bucket per bucket id its filter made, and reports them all in one message; 20 000
	// is a busy Envoy's worth (some 10 MiB of the budget).
	DefaultMaxStreamBuckets = 20_000
	// DefaultMaxStreamsPerAddr is Options.MaxStreamsPerAddr when zero. An Envoy holds one
	// stream per RLQS filter configuration; 64 leaves room for a host running several
	// Envoys, or a NAT in front of a few, and lets no one address hold the server's
	// streams.
	DefaultMaxStreamsPerAddr = 64
	// DefaultStreamIdleTimeout is Options.StreamIdleTimeout when zero: Envoy reports on
	// its stream every reporting interval, buckets or none, so a stream silent for twelve
	// default intervals has no Envoy behind it that still counts.
	DefaultStreamIdleTimeout = time.Minute
	// DefaultSendTimeout is Options.SendTimeout when zero: how long a response may wait
	// for its client to read (HTTP/2 flow control) before the stream is cut, the HTTP
	// API's write timeout.
	DefaultSendTimeout = 10 * time.Second
)

// The HTTP/2 receive windows of the RLQS gRPC server (ServerOptions): fixed, so that a
// stream whose handler waits on its client holds at most this much of its reports in the
// server. grpc-go's default grows them by bandwidth estimation up to 16 MiB a stream, which
// let 400 streams that sent faster than they read hold gigabytes.
const (
	streamWindowBytes = 256 << 10
	connWindowBytes   = 1 << 20
)

// Options configures a Server. The zero value is ready to use.
type Options struct {
	// TTL is every assignment's assignment_time_to_live, rounded up to whole seconds (Envoy
	// reads the seconds only): how long a client that stops hearing from the server keeps
	// deciding on its last assignment. Tie it to the staleness bound of the counts
	// (serve/server passes its MaxStaleness): past it the enforcer itself stops trusting
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
	// MaxBytes bounds the memory the Server's streams and buckets keep alive, by an
	// estimate of each (streamBytes, bucketBytes): a new stream past it is refused with
	// ResourceExhausted, a new bucket past it is refused — left without an assignment, so
	// that its Envoy applies its no_assignment_behavior — and counted. Default
	// DefaultMaxBytes; negative: no bound.
	MaxBytes int64
	// MaxStreamBuckets bounds the buckets of one stream; buckets past it are refused as
	// for MaxBytes. Default DefaultMaxStreamBuckets; negative: no bound.
	MaxStreamBuckets int
	// MaxStreamsPerAddr bounds the streams open at once from one client address (IPv6:
	// one /64), as the listeners bound connections; a stream past it is refused with
	// ResourceExhausted. Default DefaultMaxStreamsPerAddr; negative: no bound.
	MaxStreamsPerAddr int
	// StreamIdleTimeout cuts a stream that sends no report for this long. It and
	// SendTimeout need the grpc.Server made with ServerOptions. Default
	// DefaultStreamIdleTimeout; negative: never.
	StreamIdleTimeout time.Duration
	// SendTimeout cuts a stream whose response its client has not taken for this long:
	// a client that does not read is cut, not buffered for. Default DefaultSendTimeout;
	// negative: never.
	SendTimeout time.Duration
	// Clock defaults to the wall clock.
	Clock clock.Clock
	// Logger defaults to a logger that discards.
	Logger *slog.Logger
	// Registerer receives the Server's metrics; nil registers nothing.
	Registerer prometheus.Registerer
}

// Server serves StreamRateLimitQuotas from an enforcer.Engine; see the package
// documentation. It is safe for simultaneous use by multiple goroutines.
type Server struct {
	rlqsv3.UnimplementedRateLimitQuotaServiceServer

	lim      *enforcer.Engine
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

	used      atomic.Int64 // bytes charged to MaxBytes
	addrMu    sync.Mutex
	perAddr   map[netip.Addr]int   // open streams by client address
	addrBytes map[netip.Addr]int64 // bytes charged by client address (addrShare)
}

// mapperFor is the Mapper of one rules Config.
type mapperFor struct {
	cfg *rules.Config
	m   *Mapper
}

var _ rlqsv3.RateLimitQuotaServiceServer = (*Server)(nil)

// NewServer returns a Server that counts reports in l and assigns from its global limits.
func NewServer(l *enforcer.Engine, opts Options) (*Server, error) {
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
	bound := func(n *int64, def int64) {
		switch {
		case *n == 0:
			*n = def
		case *n < 0:
			*n = 0
		}
	}
	bound(&opts.MaxBytes, DefaultMaxBytes)
	for _, b := range []struct {
		n   *int
		def int
	}{{&opts.MaxStreamBuckets, DefaultMaxStreamBuckets}, {&opts.MaxStreamsPerAddr, DefaultMaxStreamsPerAddr}} {
		n := int64(*b.n)
		bound(&n, int64(b.def))
		*b.n = int(n)
	}
	for _, d := range []struct {
		d   *time.Duration
		def time.Duration
	}{{&opts.StreamIdleTimeout, DefaultStreamIdleTimeout}, {&opts.SendTimeout, DefaultSendTimeout}} {
		n := int64(*d.d)
		bound(&n, int64(d.def))
		*d.d = time.Duration(n)
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
	s := &Server{lim: l, rules: l.Config().Rules, opts: opts, metrics: m, health: health.NewServer(), epoch: opts.Clock.Now(),
		perAddr: map[netip.Addr]int{}, addrBytes: map[netip.Addr]int64{}}
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
		dst = append(dst, usage{bucket: u.GetBucketId().GetBucket(), allowed: u.GetNumRequestsAllowed(), denied: u.GetNumRequestsDenied(),
			first: u.GetTimeElapsed() != nil && u.GetTimeElapsed().GetSeconds() == 0})
	}
	return dst
}

// streamRaw serves the method from the wire form of the reports and responses.
func (s *Server) streamRaw(stream grpc.ServerStream) error {
	var r wireReports
	recv := func() (string, []usage, error) {
		if cap(r.buf) > retainBytes {
			r = wireReports{} // a large report's buffers are not kept for the next
		}
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
// responses in wire form. A stream whose context carries the cancel of ServerOptions'
// tap is cut when its client sends nothing for StreamIdleTimeout or takes no response
// for SendTimeout: a response waits on the client's HTTP/2 window, and nothing but the
// stream's context ends that wait.
func (s *Server) serve(ctx context.Context, recv func() (string, []usage, error), send func([]byte) error) error {
	addr, done, err := s.admitStream(ctx)
	if err != nil {
		return err
	}
	defer done()
	ss := s.newSession()
	ss.addr = addr
	defer ss.close(s.opts.Clock.Now())
	cut, _ := ctx.Value(cutKey{}).(context.CancelCauseFunc)
	var idle *time.Timer
	if cut != nil && s.opts.StreamIdleTimeout > 0 {
		idle = time.AfterFunc(s.opts.StreamIdleTimeout, func() { cut(errIdle) })
		defer idle.Stop()
	}
	var deadline *time.Timer // the send timeout's, stopped between sends
	for {
		domain, us, err := recv()
		if err != nil {
			if c := context.Cause(ctx); c == errIdle || c == errSlowReader {
				return s.cutStatus(c)
			}
			if errors.Is(err, io.EOF) {
				return nil
			}
			if st, ok := status.FromError(err); ok && st.Code() != codes.Unknown {
				return err
			}
			s.metrics.invalid.WithLabelValues("malformed").Inc()
			return status.Errorf(codes.InvalidArgument, "usage reports: %v", err)
		}
		if idle != nil && !idle.Reset(s.opts.StreamIdleTimeout) {
			return s.cutStatus(errIdle) // it fired while the report came
		}
		resp, err := ss.handle(ctx, s.opts.Clock.Now(), domain, us)
		if err != nil {
			return err
		}
		if resp == nil {
			continue
		}
		// One timer a stream, re-armed for each send: a timer made per response cost a
		// timer's allocation and a heap insertion at every report.
		if cut != nil && s.opts.SendTimeout > 0 {
			if deadline == nil {
				deadline = time.AfterFunc(s.opts.SendTimeout, func() { cut(errSlowReader) })
			} else {
				deadline.Reset(s.opts.SendTimeout)
			}
		}
		err = send(resp)
		if deadline != nil && !deadline.Stop() {
			return s.cutStatus(errSlowReader)
		}
		if err != nil {
			return err
		}
	}
}

// Why a stream was cut (the cause of its context's cancel).
var (
	errIdle       = errors.New("rlqs: no report for the stream idle timeout")
	errSlowReader = errors.New("rlqs: responses not read within the send timeout")
)

// cutStatus counts a stream cut for cause and returns its status. The client sees
// CANCELLED all the same when the cut interrupted a read or a send (grpc-go writes that
// status itself then), and Envoy takes any end of its stream alike: it opens another at
// its next report.
func (s *Server) cutStatus(cause error) error {
	if cause == errIdle {
		s.metrics.cut.WithLabelValues("idle").Inc()
		return status.Errorf(codes.DeadlineExceeded, "no usage report for %v", s.opts.StreamIdleTimeout)
	}
	s.metrics.cut.WithLabelValues("not_reading").Inc()
	return status.Errorf(codes.ResourceExhausted, "responses not read for %v", s.opts.SendTimeout)
}

// cutKey is the context key of a stream's cancel (tap).
type cutKey struct{}

// tap gives each RLQS stream a context that serve can cancel: the one thing that ends a
// send waiting on a client that does not read (grpc-go's write quota waits on the
// stream's context).
func (s *Server) tap(ctx context.Context, info *tap.Info) (context.Context, error) {
	if info.FullMethodName != "/"+ServiceName+"/StreamRateLimitQuotas" {
		return ctx, nil
	}
	ctx, cancel := context.WithCancelCause(ctx)
	return context.WithValue(ctx, cutKey{}, cancel), nil
}

// ServerOptions are the options the grpc.Server that s is registered on should be made
// with: ServerOption, the tap that lets s cut streams (StreamIdleTimeout, SendTimeout),
// and fixed HTTP/2 receive windows, so that a stream holds a bounded part of its
// client's reports in the server while its handler waits.
func (s *Server) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{ServerOption(), grpc.InTapHandle(s.tap),
		grpc.InitialWindowSize(streamWindowBytes), grpc.InitialConnWindowSize(connWindowBytes)}
}

// admitStream counts a new stream against MaxStreamsPerAddr and MaxBytes, and returns its
// client's address and the function that gives its place back, or ResourceExhausted.
func (s *Server) admitStream(ctx context.Context) (netip.Addr, func(), error) {
	var addr netip.Addr
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		addr = clientaddr.Of(p.Addr)
	}
	if n := s.opts.MaxStreamsPerAddr; n > 0 {
		s.addrMu.Lock()
		if s.perAddr[addr] >= n {
			s.addrMu.Unlock()
			s.metrics.refusedStreams.WithLabelValues("per_addr").Inc()
			return addr, nil, status.Errorf(codes.ResourceExhausted, "%d RLQS streams open from %v already", n, addr)
		}
		s.perAddr[addr]++
		s.addrMu.Unlock()
	}
	release := func() {
		if s.opts.MaxStreamsPerAddr > 0 {
			s.addrMu.Lock()
			if s.perAddr[addr]--; s.perAddr[addr] <= 0 {
				delete(s.perAddr, addr)
			}
			s.addrMu.Unlock()
		}
	}
	if bound := s.charge(addr, streamBytes); bound != "" {
		release()
		s.metrics.refusedStreams.WithLabelValues(bound).Inc()
		return addr, nil, status.Errorf(codes.ResourceExhausted, "RLQS memory budget full (%s)", bound)
	}
	return addr, func() { s.uncharge(addr, streamBytes); release() }, nil
}

// addrShare: one client address holds at most 1/addrShare of MaxBytes, its streams and
// their buckets together, so that a few addresses cannot take the whole budget from the
// others. Peers without an IP address (in-process connections) are not bounded apart.
const addrShare = 8

// charge adds n bytes of a stream or bucket of the client at addr to the memory in use,
// and returns "", or the bound that leaves no room for them: "addr" (addrShare) or
// "memory" (MaxBytes).
func (s *Server) charge(addr netip.Addr, n int64) string {
	max := s.opts.MaxBytes
	if max > 0 && addr.IsValid() {
		s.addrMu.Lock()
		if s.addrBytes[addr]+n > max/addrShare {
			s.addrMu.Unlock()
			return "addr"
		}
		s.addrBytes[addr] += n
		s.addrMu.Unlock()
	}
	for {
		u := s.used.Load()
		if max > 0 && u+n > max {
			s.unchargeAddr(addr, n)
			return "memory"
		}
		if s.used.CompareAndSwap(u, u+n) {
			s.metrics.memory.Add(float64(n))
			return ""
		}
	}
}

// uncharge gives back n bytes charged for addr.
func (s *Server) uncharge(addr netip.Addr, n int64) {
	s.used.Add(-n)
	s.metrics.memory.Sub(float64(n))
	s.unchargeAddr(addr, n)
}

func (s *Server) unchargeAddr(addr netip.Addr, n int64) {
	if s.opts.MaxBytes <= 0 || !addr.IsValid() {
		return
	}
	s.addrMu.Lock()
	if s.addrBytes[addr] -= n; s.addrBytes[addr] <= 0 {
		delete(s.addrBytes, addr)
	}
	s.addrMu.Unlock()
}

// MemoryInUse returns the bytes the Server's streams and buckets keep alive, by the
// estimate that Options.MaxBytes bounds.
func (s *Server) MemoryInUse() int64 { return s.used.Load() }

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
