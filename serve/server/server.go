// Package server assembles an enforcer process: the rules with hot reload, the snapshot of
// the counts topic, the hit producer, the optional Redis of the site, the Limiter, and the
// ways to ask it — the HTTP check API, the nginx auth_request endpoint, the Envoy rate-limit
// gRPC service, Envoy's Rate Limit Quota Service and a rate-limiting reverse proxy — with
// /metrics, /healthz, /readyz and the live console at /ui/ (package console).
// `streamlimit enforcer` is a thin command over it; the end-to-end tests start it in
// process.
package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/net/netutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"

	"github.com/streamlimit/streamlimit"
	"github.com/streamlimit/streamlimit/clock"
	"github.com/streamlimit/streamlimit/enforcer"
	"github.com/streamlimit/streamlimit/enforcer/snapshot"
	"github.com/streamlimit/streamlimit/internal/memsize"
	"github.com/streamlimit/streamlimit/producer"
	"github.com/streamlimit/streamlimit/serve/headers"
	"github.com/streamlimit/streamlimit/serve/httplimit"
	"github.com/streamlimit/streamlimit/serve/rlqs"
	"github.com/streamlimit/streamlimit/serve/rls"
)

// Config configures a Server: the enforcer it assembles (streamlimit.Config, whose Site and
// Rules are required) and the listeners that serve it. Every zero field takes the default
// written in its comment, applied once, by the layer that owns the field; the one default
// the Server changes is MaxMemory's, DefaultMaxMemory (a server process bounds its memory
// unless told not to: negative means no bound in bytes). With RLQSAddr, the RLQS streams
// and buckets first get memsize.RLQSPart of MaxMemory.
type Config struct {
	streamlimit.Config

	// HTTPAddr serves POST /v1/check, the nginx endpoint /v1/auth, envoyproxy/ratelimit's
	// POST /json (unless GRPCAddr is "off"), /metrics, /healthz, /readyz and the API's
	// OpenAPI document (OpenAPIPath). Default DefaultHTTPAddr.
	HTTPAddr string
	// GRPCAddr serves Envoy's RateLimitService. Default DefaultGRPCAddr; "off" disables.
	GRPCAddr string
	// NoGRPCReflection leaves gRPC server reflection off the gRPC listeners. Reflection
	// lets grpcurl and similar tools list and call the services without their protos;
	// it tells a caller only what the services are, and asks for a token like they do.
	// Default false: reflection is served.
	NoGRPCReflection bool
	// LimitOverrides says what the gRPC service and /json do with a descriptor's own
	// limit. Default rls.HonourOverrides, as envoyproxy/ratelimit.
	LimitOverrides rls.OverrideMode
	// Envoy configures the gRPC and /json answers of domains in rules.CompatEnvoy.
	Envoy rls.EnvoyOptions
	// RLQSAddr serves Envoy's Rate Limit Quota Service (package rlqs) on its own gRPC
	// listener, with the Limits, TLS and AuthTokens of GRPCAddr. Default "": not served.
	RLQSAddr string
	// RLQS tunes the RLQS server. Its TTL defaults to MaxStaleness (the assignments live
	// as long as the counts they come from are trusted), its SiteShare to 1/SiteEnforcers;
	// Clock, Logger and Registerer are the Server's.
	RLQS rlqs.Options
	// Upstream, when set, makes ProxyAddr a reverse proxy to it that rate-limits every
	// request with HTTP.
	Upstream *url.URL
	// ProxyAddr is the reverse proxy's address. Default DefaultProxyAddr (loopback, like
	// the other listeners: serving the world is a decision to state).
	ProxyAddr string
	// ProxyMaxDelay makes the reverse proxy hold a request that its limits will admit
	// within this long until they do, instead of answering 429 at once (httplimit.Delay).
	// Default 0: answer at once.
	ProxyMaxDelay time.Duration
	// HTTP says how HTTP requests (proxy and /v1/auth) become descriptors. Its Domain is
	// required when Upstream is set or /v1/auth is to be served.
	HTTP httplimit.Config
	// Auth configures /v1/auth.
	Auth httplimit.AuthOptions
	// AuthMaxDelay makes /v1/auth hold a request that its limits will admit within this
	// long until they do, instead of denying it at once (nginx's proxy_read_timeout for
	// the subrequest must be longer). Default 0: answer at once.
	AuthMaxDelay time.Duration

	// Limits bound what clients can hold of the listeners: timeouts, header and body
	// sizes, connections, gRPC streams and keepalive. Each zero field takes its default
	// (see Limits).
	Limits Limits
	// TLS, when set, serves the HTTP API and gRPC over TLS, and with a client CA requires
	// client certificates. Default plaintext. The reverse proxy stays plaintext.
	TLS TLSFiles
	// AuthTokens, when set, are the bearer tokens a caller of the HTTP API (check, auth,
	// metrics) and of gRPC must present ("Authorization: Bearer <token>"); /healthz,
	// /readyz and the gRPC health service stay open. Default none: no token is asked.
	AuthTokens []string
	// AllowedHosts, when set, are the host names (or addresses; no port) that requests to
	// the HTTP API and the console may give as their Host; any other is answered 421, so
	// that a name an attacker points at the enforcer's address (DNS rebinding) does not
	// make a web page of the API's origin. The health probes, /openapi.yaml and /v1/auth
	// (whose Host is the original request's) answer any host. A request carrying an
	// Origin that is neither its own host nor an allowed one is answered 403, with these
	// or without (see browserGuard). Default none: any Host.
	AllowedHosts []string

	// ShutdownTimeout bounds the graceful shutdown (draining requests, flushing hits).
	// Default DefaultShutdownTimeout.
	ShutdownTimeout time.Duration
	// Registry receives every metric and is served on /metrics. Default: a new registry.
	Registry *prometheus.Registry
}

func (c Config) normalize() (Config, error) {
	var errs []error
	if c.Site == "" {
		errs = append(errs, errors.New("site is required"))
	}
	if c.Rules == "" {
		errs = append(errs, errors.New("rules path is required"))
	}
	if c.HTTPAddr == "" {
		c.HTTPAddr = DefaultHTTPAddr
	}
	if c.GRPCAddr == "" {
		c.GRPCAddr = DefaultGRPCAddr
	}
	if c.ProxyAddr == "" {
		c.ProxyAddr = DefaultProxyAddr
	}
	var err error
	if c.Limits, err = c.Limits.normalize(); err != nil {
		errs = append(errs, fmt.Errorf("limits: %w", err))
	}
	if c.ShutdownTimeout <= 0 {
		c.ShutdownTimeout = DefaultShutdownTimeout
	}
	if c.MaxMemory == 0 {
		c.MaxMemory = DefaultMaxMemory
	}
	if c.Upstream != nil && c.HTTP.Domain == "" {
		errs = append(errs, errors.New("a reverse proxy needs the HTTP descriptor config (domain and descriptors)"))
	}
	// The clock and logger are shared with the parts the Server builds around the
	// Limiter, so they are settled here rather than left to streamlimit.New.
	c.Clock = clock.Or(c.Clock)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Registry == nil {
		c.Registry = prometheus.NewRegistry()
	}
	return c, errors.Join(errs...)
}

// Server is an assembled enforcer process. New builds it and binds its listeners; Run
// serves until its context ends, then shuts down gracefully.
type Server struct {
	cfg     Config
	log     *slog.Logger
	core    *streamlimit.Limiter // the rules, counters, snapshot and producer
	lim     *enforcer.Engine
	mw      *httplimit.Middleware
	proxyMW *httplimit.Middleware // mw, or one that waits up to ProxyMaxDelay
	authMW  *httplimit.Middleware // mw, or one that waits up to AuthMaxDelay
	rls     *rls.Server
	rlqs    *rlqs.Server

	httpLn, grpcLn, proxyLn net.Listener
	rlqsLn                  net.Listener
	tls                     *tls.Config // nil: plaintext
	tokens                  tokens
	guard                   browserGuard
	// connsRefused counts connections closed at accept for their address's bound.
	connsRefused atomic.Uint64

	mu      sync.Mutex
	started bool
}

// New builds the Server's parts and binds its listeners, so that the addresses are known
// before Run. On error nothing is left open.
func New(cfg Config) (_ *Server, err error) {
	cfg, err = cfg.normalize()
	if err != nil {
		return nil, fmt.Errorf("enforcer: %w", err)
	}
	s := &Server{cfg: cfg, log: cfg.Logger}
	defer func() {
		if err != nil {
			s.closeAll()
		}
	}()
	reg := cfg.Registry
	if s.tls, err = cfg.TLS.config(cfg.Clock, s.log); err != nil {
		return nil, fmt.Errorf("enforcer: %w", err)
	}
	if s.tokens, err = newTokens(cfg.AuthTokens); err != nil {
		return nil, fmt.Errorf("enforcer: %w", err)
	}
	if s.guard, err = newBrowserGuard(cfg.AllowedHosts); err != nil {
		return nil, fmt.Errorf("enforcer: %w", err)
	}

	// The ports first: an enforcer that cannot serve must fail before its producer
	// starts, whose heartbeats and leave records would tell every other site that it
	// joined and left.
	if s.httpLn, err = s.listen(cfg.HTTPAddr, s.tls == nil); err != nil {
		return nil, fmt.Errorf("enforcer: http listener: %w", err)
	}
	if s.tls != nil {
		s.httpLn = tls.NewListener(s.httpLn, s.tls)
	}
	if cfg.GRPCAddr != "off" {
		// gRPC does its own TLS handshake (credentials), which negotiates HTTP/2.
		if s.grpcLn, err = s.listen(cfg.GRPCAddr, false); err != nil {
			return nil, fmt.Errorf("enforcer: grpc listener: %w", err)
		}
	}
	if cfg.RLQSAddr != "" {
		if s.rlqsLn, err = s.listen(cfg.RLQSAddr, false); err != nil {
			return nil, fmt.Errorf("enforcer: rlqs listener: %w", err)
		}
	}
	if cfg.Upstream != nil {
		if s.proxyLn, err = s.listen(cfg.ProxyAddr, true); err != nil {
			return nil, fmt.Errorf("enforcer: proxy listener: %w", err)
		}
	}
	// The RLQS streams and buckets get their part of the memory target; the per-key
	// structures share the rest.
	var rlqsBytes int64
	if cfg.RLQSAddr != "" {
		rlqsBytes = memsize.RLQSPart(cfg.MaxMemory)
	}
	core := cfg.Config
	core.Registerer = reg
	if cfg.MaxMemory > 0 {
		core.MaxMemory = cfg.MaxMemory - 2*rlqsBytes
	}
	s.core, err = streamlimit.New(core)
	if err != nil {
		return nil, fmt.Errorf("enforcer: %w", err)
	}
	s.lim = s.core.Engine()
	if cfg.HTTP.Domain != "" {
		s.mw, err = httplimit.New(s.lim, httplimit.Options{Config: cfg.HTTP, Logger: s.log})
		if err != nil {
			return nil, err
		}
		if s.proxyMW, err = s.delaying(cfg.ProxyMaxDelay); err != nil {
			return nil, err
		}
		if s.authMW, err = s.delaying(cfg.AuthMaxDelay); err != nil {
			return nil, err
		}
	}
	if cfg.GRPCAddr != "off" {
		s.rls, err = rls.NewServer(s.lim, rls.Options{Logger: s.log, Registerer: reg, Overrides: cfg.LimitOverrides, Compat: cfg.Load.Compat, Envoy: cfg.Envoy})
		if err != nil {
			return nil, err
		}
	}
	if cfg.RLQSAddr != "" {
		o := cfg.RLQS
		if o.TTL == 0 {
			o.TTL = cfg.MaxStaleness
		}
		if o.SiteShare == 0 {
			o.SiteShare = 1 / float64(max(cfg.SiteEnforcers, 1)) // each enforcer's part while Redis is away, as streamlimit.New gives it
		}
		if o.MaxBytes == 0 {
			o.MaxBytes = rlqsBytes
			if cfg.MaxMemory < 0 {
				o.MaxBytes = -1 // no bound in bytes, as for the per-key structures
			}
		}
		o.Clock, o.Logger, o.Registerer = cfg.Clock, s.log, reg
		if s.rlqs, err = rlqs.NewServer(s.lim, o); err != nil {
			return nil, err
		}
	}
	s.registerMetrics(reg)
	// Until Run sees the Server ready, the gRPC health services say it is not.
	if ok, _ := s.Ready(); !ok {
		s.setServing(false)
	}

	return s, nil
}

// listen binds addr, holding at most Limits.MaxConns connections at once, and
// Limits.MaxConnsPerAddr from one client address; plainHTTP says that it serves HTTP/1.1
// without TLS, so that a connection past the per-address bound can be answered 503.
func (s *Server) listen(addr string, plainHTTP bool) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	if n := s.cfg.Limits.MaxConnsPerAddr; n > 0 {
		ln = newPerAddrListener(ln, n, &s.connsRefused, plainHTTP)
	}
	if n := s.cfg.Limits.MaxConns; n > 0 {
		ln = netutil.LimitListener(ln, n)
	}
	return ln, nil
}

// httpServer returns an http.Server for h with the Limits; proxy selects the reverse
// proxy's timeouts.
func (s *Server) httpServer(h http.Handler, proxy bool) *http.Server {
	l := s.cfg.Limits
	// A request held for room (AuthMaxDelay, ProxyMaxDelay) is answered that much later:
	// the write timeout grows by the wait, so that the wait ends in a decision, not in a
	// closed connection.
	read, write := l.ReadTimeout, extend(l.WriteTimeout, s.cfg.AuthMaxDelay)
	if proxy {
		read, write = l.ProxyTimeout, extend(l.ProxyTimeout, s.cfg.ProxyMaxDelay)
	}
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: l.ReadHeaderTimeout,
		ReadTimeout:       read,
		WriteTimeout:      write,
		IdleTimeout:       l.IdleTimeout,
		MaxHeaderBytes:    l.MaxHeaderBytes,
		ErrorLog:          log.New(httpErrorLog{s.log}, "", 0),
	}
}

// httpErrorLog is the HTTP servers' error log. Most of what net/http reports there is a
// client's doing (a TLS handshake abandoned, a request cut short) and goes out at debug
// level; a handler's panic is this program's fault, and goes out as an error with its
// stack: net/http recovers it and closes the connection, so the client sees only EOF.
type httpErrorLog struct{ log *slog.Logger }

func (w httpErrorLog) Write(p []byte) (int, error) {
	msg := strings.TrimSuffix(string(p), "\n")
	level := slog.LevelDebug
	if strings.HasPrefix(msg, "http: panic serving") {
		level = slog.LevelError
	}
	w.log.Log(context.Background(), level, msg)
	return len(p), nil
}

// extend returns timeout lengthened by wait; 0 (no bound) stays 0.
func extend(timeout, wait time.Duration) time.Duration {
	if timeout <= 0 {
		return 0
	}
	return timeout + max(wait, 0)
}

// grpcServer returns the gRPC server with the Limits, TLS and tokens, then extra.
func (s *Server) grpcServer(extra ...grpc.ServerOption) *grpc.Server {
	l := s.cfg.Limits
	opts := []grpc.ServerOption{
		// Stream workers keep their grown stacks from call to call: without them every call
		// starts a goroutine whose stack grows (copies) several times, a seventh of the
		// serving CPU in the profile of the serving benchmark.
		grpc.NumStreamWorkers(uint32(64 * runtime.GOMAXPROCS(0))),
		grpc.MaxRecvMsgSize(int(l.MaxBodyBytes)),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: l.GRPCKeepaliveMinTime, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: l.GRPCMaxConnIdle}),
	}
	if l.GRPCHandshakeTimeout > 0 { // grpc-go reads 0 as "at once"
		opts = append(opts, grpc.ConnectionTimeout(l.GRPCHandshakeTimeout))
	}
	if l.GRPCMaxStreams > 0 {
		opts = append(opts, grpc.MaxConcurrentStreams(uint32(l.GRPCMaxStreams)))
	}
	if l.MaxHeaderBytes > 0 {
		// The bound of HTTP's header block, for gRPC's metadata: grpc-go's own is 16 MiB a
		// call. The server announces it in its HTTP/2 settings and resets a stream whose
		// headers exceed it.
		opts = append(opts, grpc.MaxHeaderListSize(uint32(l.MaxHeaderBytes)))
	}
	if s.tls != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(s.tls)))
	}
	return grpc.NewServer(append(append(opts, s.tokens.grpcOptions()...), extra...)...)
}

func (s *Server) registerMetrics(reg prometheus.Registerer) {
	c := prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "streamlimit", Subsystem: "enforcer", Name: "conns_refused_total",
		Help: "Connections refused when accepted (answered 503 on plaintext HTTP listeners, closed on the others) because their client address held --max-conns-per-addr on that listener."},
		func() float64 { return float64(s.connsRefused.Load()) })
	if err := reg.Register(c); err != nil {
		s.log.Warn("metric not registered", "err", err)
	}
}

// Engine returns the Server's decision engine, to embed it or to decide in tests.
func (s *Server) Engine() *enforcer.Engine { return s.lim }

// Snapshot returns the snapshot of the counts topic, nil without Kafka.
func (s *Server) Snapshot() *snapshot.Snapshot { return s.core.Snapshot() }

// Producer returns the hit producer, nil without Kafka.
func (s *Server) Producer() *producer.Producer { return s.core.Producer() }

// HTTPAddr returns the address of the check API and the admin endpoints.
func (s *Server) HTTPAddr() string { return s.httpLn.Addr().String() }

// GRPCAddr returns the address of the Envoy gRPC service, "" when disabled.
func (s *Server) GRPCAddr() string {
	if s.grpcLn == nil {
		return ""
	}
	return s.grpcLn.Addr().String()
}

// RLQSAddr returns the address of the Rate Limit Quota Service, "" when not served.
func (s *Server) RLQSAddr() string {
	if s.rlqsLn == nil {
		return ""
	}
	return s.rlqsLn.Addr().String()
}

// ProxyAddr returns the address of the reverse proxy, "" when there is none.
func (s *Server) ProxyAddr() string {
	if s.proxyLn == nil {
		return ""
	}
	return s.proxyLn.Addr().String()
}

// Ready reports whether the Server decides on complete data: the snapshot of the counts
// topic is restored (always true without Kafka). The reason says what it waits for.
func (s *Server) Ready() (bool, string) { return s.core.Ready() }

// setServing sets the gRPC health status of every gRPC service the Server has.
func (s *Server) setServing(serving bool) {
	if s.rls != nil {
		s.rls.SetServing(serving)
	}
	if s.rlqs != nil {
		s.rlqs.SetServing(serving)
	}
}

// followReadiness keeps the gRPC health services in step with Ready, so that a gRPC
// probe (Kubernetes' grpc probe, a load balancer's health check) and /readyz agree: an
// enforcer still restoring the counts topic is NOT_SERVING and takes no traffic from
// them. It waits for the restore, then asks Ready every readinessPoll, since a clock that
// drifts off the aggregators' makes it unready again (snapshot.Snapshot.CheckClock). It
// returns when ctx ends.
func (s *Server) followReadiness(ctx context.Context) {
	if ok, _ := s.Ready(); !ok && (s.core.WaitReady(ctx) != nil || ctx.Err() != nil) {
		return
	}
	serving, _ := s.Ready()
	s.setServing(serving)
	t := time.NewTicker(readinessPoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if ok, _ := s.Ready(); ok != serving {
				serving = ok
				s.setServing(serving)
			}
		}
	}
}

// readinessPoll is how often followReadiness asks Ready once the counts topic is
// restored: as often as a readiness probe would.
const readinessPoll = time.Second

// registerReflection registers gRPC server reflection on gs unless NoGRPCReflection.
func (s *Server) registerReflection(gs *grpc.Server) {
	if !s.cfg.NoGRPCReflection {
		reflection.Register(gs)
	}
}

// delaying returns s.mw, or, when maxDelay > 0, a middleware like it that waits up to
// maxDelay for room instead of refusing.
func (s *Server) delaying(maxDelay time.Duration) (*httplimit.Middleware, error) {
	if maxDelay <= 0 {
		return s.mw, nil
	}
	return httplimit.New(httplimit.Delay(s.lim, maxDelay), httplimit.Options{Config: s.cfg.HTTP, Logger: s.log})
}

// Handler returns the HTTP handler of HTTPAddr, asking for a bearer token when
// Config.AuthTokens are set, with the console at ConsolePath, behind the checks that keep
// web pages out (Config.AllowedHosts, browserGuard).
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("POST /v1/check", httplimit.NewCheckHandler(s.lim, httplimit.CheckOptions{Logger: s.log, MaxBodyBytes: s.cfg.Limits.MaxBodyBytes,
		WriteTimeout: s.cfg.Limits.WriteTimeout}))
	if s.rls != nil {
		// envoyproxy/ratelimit's HTTP twin of the gRPC service, for drop-in clients.
		mux.Handle("POST /json", s.rls.JSONHandler())
	}
	if s.mw != nil {
		mux.Handle("/v1/auth", s.authMW.AuthHandler(s.cfg.Auth))
	}
	mux.HandleFunc("GET "+OpenAPIPath, serveOpenAPI)
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.cfg.Registry, promhttp.HandlerOpts{Registry: s.cfg.Registry}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		ok, why := s.Ready()
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_, _ = w.Write([]byte(why + "\n"))
	})
	return s.guard.wrap(s.withConsole(s.tokens.requireToken(tooLarge(mux, max(s.cfg.Limits.MaxBodyBytes, rls.DefaultMaxJSONBytes)))))
}

// tooLarge answers 413 at once, and closes the connection, when a request declares a
// body larger than limit, the most any endpoint reads, instead of reading it until a
// handler's bound or the read timeout: a client that declares 10 GiB and sends a byte a
// second held its connection for the whole read timeout.
func tooLarge(h http.Handler, limit int64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength > limit {
			w.Header().Set("Connection", "close")
			if r.URL.Path == "/json" { // answered as its handler answers
				http.Error(w, "request body larger than "+strconv.Itoa(rls.DefaultMaxJSONBytes)+" bytes", http.StatusRequestEntityTooLarge)
				return
			}
			writeTooLarge(w, limit)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// writeTooLarge writes the API's 413 problem.
func writeTooLarge(w http.ResponseWriter, limit int64) {
	body := fmt.Sprintf(`{"type":"about:blank","title":"Request Entity Too Large","status":413,"detail":"the body is larger than %d bytes"}`, limit)
	w.Header().Set("Content-Type", headers.ProblemContentType)
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(http.StatusRequestEntityTooLarge)
	_, _ = io.WriteString(w, body)
}

// Run serves until ctx ends, then stops accepting requests, drains those in flight,
// flushes the hits not yet published and releases everything, within ShutdownTimeout.
// It returns the first error of a part that failed while serving, or nil once ctx ended
// it: requests still in flight at the timeout and hits Kafka did not take in time are
// logged as warnings, not returned (a stop that ran out of time is still a stop).
func (s *Server) Run(ctx context.Context) error {
	s.mu.Lock()
	if s.started {
		s.mu.Unlock()
		return errors.New("enforcer: Run called twice")
	}
	s.started = true
	s.mu.Unlock()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg    sync.WaitGroup
		errMu sync.Mutex
		first error
	)
	fail := func(part string, err error) {
		if err == nil || errors.Is(err, context.Canceled) {
			return
		}
		errMu.Lock()
		if first == nil {
			first = fmt.Errorf("enforcer: %s: %w", part, err)
		}
		errMu.Unlock()
		cancel()
	}
	goRun := func(part string, f func() error) {
		wg.Add(1)
		go func() { defer wg.Done(); fail(part, f()) }()
	}

	goRun("core", func() error { return s.core.Run(ctx) })

	servers := []*http.Server{s.httpServer(s.Handler(), false)}
	lns := []net.Listener{s.httpLn}
	if s.proxyLn != nil {
		servers = append(servers, s.httpServer(httplimit.NewProxy(s.cfg.Upstream, s.proxyMW), true))
		lns = append(lns, s.proxyLn)
	}
	for i, srv := range servers {
		goRun("http", func() error {
			if err := srv.Serve(lns[i]); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		})
	}
	// The gRPC health service reports what /readyz does; followReadiness is done before
	// the shutdown sets it NOT_SERVING, so that it cannot set it back.
	healthDone := make(chan struct{})
	go func() { defer close(healthDone); s.followReadiness(ctx) }()
	var gs *grpc.Server
	if s.rls != nil {
		gs = s.grpcServer()
		s.rls.Register(gs)
		s.registerReflection(gs)
		goRun("grpc", func() error { return serveGRPC(gs, s.grpcLn) })
	}
	var qs *grpc.Server
	if s.rlqs != nil {
		// An Envoy reports all its buckets in one message, larger than a check request.
		qs = s.grpcServer(append(s.rlqs.ServerOptions(), grpc.MaxRecvMsgSize(max(rlqs.MaxReportBytes, int(s.cfg.Limits.MaxBodyBytes))))...)
		s.rlqs.Register(qs)
		s.registerReflection(qs)
		goRun("rlqs", func() error { return serveGRPC(qs, s.rlqsLn) })
		goRun("rlqs sweeper", func() error { return s.rlqs.Run(ctx) })
	}
	s.log.Info("enforcer serving", "site", s.cfg.Site, "http", s.HTTPAddr(), "grpc", s.GRPCAddr(), "rlqs", s.RLQSAddr(), "proxy", s.ProxyAddr())

	<-ctx.Done()
	<-healthDone
	sctx, scancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.ShutdownTimeout)
	defer scancel()
	s.setServing(false)
	if qs != nil {
		// RLQS streams last as long as their Envoys: cut them, and each Envoy starts its
		// stream again at its next report, on another server, deciding meanwhile on its
		// last assignments.
		qs.Stop()
	}
	// Requests still running at the shutdown timeout are cut off (their connections
	// closed, which ends a wait for room), and that is logged: the stop itself succeeded,
	// and Run returns nil for it.
	for i, srv := range servers {
		if err := srv.Shutdown(sctx); err != nil {
			s.log.Warn("shutdown: HTTP requests still in flight at the shutdown timeout were cut off",
				"listener", lns[i].Addr().String(), "shutdown_timeout", s.cfg.ShutdownTimeout, "err", err)
			_ = srv.Close()
		}
	}
	if gs != nil {
		stopped := make(chan struct{})
		go func() { gs.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-sctx.Done():
			s.log.Warn("shutdown: gRPC calls still in flight at the shutdown timeout were cut off",
				"listener", s.GRPCAddr(), "shutdown_timeout", s.cfg.ShutdownTimeout)
			gs.Stop()
		}
	}
	wg.Wait()
	if err := s.core.Close(sctx); err != nil {
		s.logUndelivered(err)
	}
	s.closeAll()
	return first
}

// serveGRPC serves gs on ln until gs is stopped. A stop that came before Serve began (a
// shutdown signalled as the server starts: Run's goroutines may not have been scheduled
// yet) is a clean stop too, not an error: grpc-go reports it as grpc.ErrServerStopped.
func serveGRPC(gs *grpc.Server, ln net.Listener) error {
	if err := gs.Serve(ln); !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	return nil
}

// logUndelivered logs the hits that the producer could not deliver at shutdown (Kafka
// unreachable or slow, or the shutdown timeout spent draining requests). They are lost to
// the other sites' counts for the rest of their windows, and without the leave record the
// other sites find this one silent instead: a shutdown that could not finish its work,
// which is logged, not a failure of the process. Run still returns nil for it: an
// orchestrator takes a non-zero exit for a crash, and a restart would not bring them back.
func (s *Server) logUndelivered(err error) {
	if ue, ok := errors.AsType[*producer.UndeliveredError](err); ok {
		s.log.Warn("shutdown: hits not delivered to Kafka; the other sites do not count them",
			"hits", ue.Hits, "records", ue.Records, "shutdown_timeout", s.cfg.ShutdownTimeout, "err", ue.Err)
		return
	}
	s.log.Warn("shutdown: closing the hit producer", "err", err)
}

// closeAll releases what New opened; safe on a partly built Server.
func (s *Server) closeAll() {
	for _, ln := range []net.Listener{s.httpLn, s.grpcLn, s.proxyLn, s.rlqsLn} {
		if ln != nil {
			_ = ln.Close()
		}
	}
	if s.core != nil {
		// Close happens once: after Run's own Close, this does nothing.
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = s.core.Close(ctx)
		cancel()
	}
}
