package server

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/streamlimit/streamlimit/serve/httplimit"
)

// The defaults of Limits, stated here and nowhere else: `streamlimit enforcer` shows them
// as its flags' defaults. They are sized for a rate-limit service whose callers send small
// requests and expect answers in milliseconds, so that slow or idle clients (by accident or
// on purpose) cannot hold the server's connections, memory or goroutines.
const (
	// DefaultReadHeaderTimeout bounds reading a request's headers.
	DefaultReadHeaderTimeout = 5 * time.Second
	// DefaultReadTimeout bounds reading a whole request, body included, on the HTTP API: a
	// check request is a few hundred bytes, so a body still arriving after this is a
	// client holding the connection.
	DefaultReadTimeout = 10 * time.Second
	// DefaultWriteTimeout bounds writing a response on the HTTP API (from the end of the
	// request's headers).
	DefaultWriteTimeout = 10 * time.Second
	// DefaultProxyTimeout bounds reading a request and writing its response in the reverse
	// proxy, where bodies and the upstream's answers may legitimately take longer.
	DefaultProxyTimeout = 60 * time.Second
	// DefaultIdleTimeout is how long a keep-alive connection may wait for its next request.
	DefaultIdleTimeout = 60 * time.Second
	// DefaultMaxHeaderBytes bounds a request's header block: an HTTP request's, and a gRPC
	// call's metadata (its HTTP/2 header list), which grpc-go would otherwise take up to
	// 16 MiB of per call.
	DefaultMaxHeaderBytes = 32 << 10
	// DefaultMaxConns bounds the connections each listener holds at once; further clients
	// wait in the kernel's accept queue until one closes.
	DefaultMaxConns = 4096
	// DefaultMaxConnsPerAddr bounds the connections each listener holds from one client
	// address (IPv6: one /64) at once; a connection past it is refused when accepted
	// (answered 503 on a plaintext HTTP listener, closed on the others). It
	// leaves room for a proxy's or gateway's connection pool, and lets 32 addresses, no
	// fewer, fill a listener.
	DefaultMaxConnsPerAddr = 128
	// DefaultGRPCHandshakeTimeout bounds a new gRPC connection's handshake (TLS and the
	// HTTP/2 preface): grpc-go's own default, 120 s, let silent connections pile up.
	DefaultGRPCHandshakeTimeout = 5 * time.Second
	// DefaultGRPCMaxStreams bounds the concurrent calls (streams) of one gRPC connection.
	DefaultGRPCMaxStreams = 256
	// DefaultGRPCKeepaliveMinTime is the shortest interval between a client's keepalive
	// pings that the gRPC server tolerates; a client pinging more often is disconnected.
	DefaultGRPCKeepaliveMinTime = 10 * time.Second
	// DefaultGRPCMaxConnIdle closes a gRPC connection without calls for this long.
	DefaultGRPCMaxConnIdle = 5 * time.Minute
)

// DefaultShutdownTimeout is Config.ShutdownTimeout when zero: how long draining requests
// and flushing hits (and the site's leave records) may take at shutdown.
const DefaultShutdownTimeout = 10 * time.Second

// Limits bound what clients can hold of the enforcer's servers. Each zero field takes the
// Default* constant of its name; a negative duration or count turns that bound off.
type Limits struct {
	// ReadHeaderTimeout applies to every HTTP listener. Default DefaultReadHeaderTimeout.
	ReadHeaderTimeout time.Duration
	// ReadTimeout is the HTTP API's bound on reading a request. Default DefaultReadTimeout.
	ReadTimeout time.Duration
	// WriteTimeout is the HTTP API's bound on writing a response, lengthened by
	// Config.AuthMaxDelay, and for a check request that asks to wait for room by its
	// max_delay_ms (httplimit.CheckOptions.WriteTimeout). Default DefaultWriteTimeout.
	WriteTimeout time.Duration
	// ProxyTimeout is the reverse proxy's read and write bound, its write bound
	// lengthened by Config.ProxyMaxDelay. Default DefaultProxyTimeout.
	ProxyTimeout time.Duration
	// IdleTimeout applies to every HTTP listener. Default DefaultIdleTimeout.
	IdleTimeout time.Duration
	// MaxHeaderBytes applies to every HTTP listener, and to every gRPC server as the
	// largest header list (metadata) a call may send. Default DefaultMaxHeaderBytes.
	MaxHeaderBytes int
	// MaxBodyBytes bounds a check request's body (413 beyond) and a gRPC request message.
	// Default httplimit.DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// MaxConns bounds the connections of each listener (HTTP API, gRPC, proxy). Default
	// DefaultMaxConns.
	MaxConns int
	// MaxConnsPerAddr bounds the connections of each listener from one client address.
	// Default DefaultMaxConnsPerAddr.
	MaxConnsPerAddr int
	// GRPCHandshakeTimeout bounds a gRPC connection's handshake. Default
	// DefaultGRPCHandshakeTimeout.
	GRPCHandshakeTimeout time.Duration
	// GRPCMaxStreams bounds the concurrent calls of one gRPC connection. Default
	// DefaultGRPCMaxStreams.
	GRPCMaxStreams int
	// GRPCKeepaliveMinTime is the shortest keepalive ping interval tolerated. Default
	// DefaultGRPCKeepaliveMinTime.
	GRPCKeepaliveMinTime time.Duration
	// GRPCMaxConnIdle closes idle gRPC connections. Default DefaultGRPCMaxConnIdle.
	GRPCMaxConnIdle time.Duration
}

// DefaultLimits returns Limits with every default filled in.
func DefaultLimits() Limits {
	l, _ := Limits{}.normalize()
	return l
}

// normalize fills the defaults and turns negative values into 0 (no bound).
func (l Limits) normalize() (Limits, error) {
	dur := func(d *time.Duration, def time.Duration) {
		switch {
		case *d == 0:
			*d = def
		case *d < 0:
			*d = 0
		}
	}
	dur(&l.ReadHeaderTimeout, DefaultReadHeaderTimeout)
	dur(&l.ReadTimeout, DefaultReadTimeout)
	dur(&l.WriteTimeout, DefaultWriteTimeout)
	dur(&l.ProxyTimeout, DefaultProxyTimeout)
	dur(&l.IdleTimeout, DefaultIdleTimeout)
	dur(&l.GRPCKeepaliveMinTime, DefaultGRPCKeepaliveMinTime)
	dur(&l.GRPCMaxConnIdle, DefaultGRPCMaxConnIdle)
	dur(&l.GRPCHandshakeTimeout, DefaultGRPCHandshakeTimeout)
	count := func(n *int, def int) {
		switch {
		case *n == 0:
			*n = def
		case *n < 0:
			*n = 0
		}
	}
	count(&l.MaxHeaderBytes, DefaultMaxHeaderBytes)
	count(&l.MaxConns, DefaultMaxConns)
	count(&l.MaxConnsPerAddr, DefaultMaxConnsPerAddr)
	count(&l.GRPCMaxStreams, DefaultGRPCMaxStreams)
	if l.MaxBodyBytes == 0 {
		l.MaxBodyBytes = httplimit.DefaultMaxBodyBytes
	}
	var errs []error
	if l.MaxBodyBytes < 0 {
		errs = append(errs, fmt.Errorf("max body bytes %d: a check request needs a body", l.MaxBodyBytes))
	}
	if l.MaxHeaderBytes > math.MaxUint32 {
		errs = append(errs, fmt.Errorf("max header bytes %d is too large", l.MaxHeaderBytes))
	}
	if l.GRPCMaxStreams > 1<<31-1 {
		errs = append(errs, fmt.Errorf("gRPC max streams %d is too large", l.GRPCMaxStreams))
	}
	return l, errors.Join(errs...)
}

// The default listen addresses: loopback, so that a server started without flags is not
// reachable from the network (the check API trusts its callers).
const (
	// DefaultHTTPAddr is Config.HTTPAddr when empty.
	DefaultHTTPAddr = "127.0.0.1:8081"
	// DefaultGRPCAddr is Config.GRPCAddr when empty.
	DefaultGRPCAddr = "127.0.0.1:8082"
	// DefaultProxyAddr is Config.ProxyAddr when empty.
	DefaultProxyAddr = "127.0.0.1:8080"
)

// DefaultMaxMemory is Config.MaxMemory when zero: 2 GiB. The structures then keep up to
// 1 GiB alive: some 700 000 keys of global limits with their snapshot counts, or 550 000
// keys of local limits (docs/hardening.md has the measurements).
const DefaultMaxMemory = 2 << 30
