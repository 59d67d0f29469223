package server

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/streamlimit/streamlimit/clock"
	"github.com/streamlimit/streamlimit/serve/headers"
)

// TLSFiles configures TLS for the HTTP API and the gRPC service. The zero value means
// plaintext.
type TLSFiles struct {
	// CertFile and KeyFile are the server's PEM certificate (chain) and key; both or
	// neither. They are read again when either file changes (checked at most once a
	// second, at a handshake), so that a renewed certificate is served without a restart;
	// a pair that does not load is logged and the previous one kept.
	CertFile, KeyFile string
	// ClientCAFile, when set, requires every client to present a certificate signed by
	// one of these PEM CAs (mutual TLS). It needs CertFile.
	ClientCAFile string
}

func (t TLSFiles) enabled() bool { return t.CertFile != "" || t.KeyFile != "" || t.ClientCAFile != "" }

// config returns the server TLS configuration, or nil for plaintext.
func (t TLSFiles) config(clk clock.Clock, log *slog.Logger) (*tls.Config, error) {
	if !t.enabled() {
		return nil, nil
	}
	if t.CertFile == "" || t.KeyFile == "" {
		return nil, errors.New("TLS needs both a certificate and a key file")
	}
	r := &certReloader{cert: t.CertFile, key: t.KeyFile, clk: clk, log: log}
	if err := r.load(); err != nil {
		return nil, err
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: r.get}
	if t.ClientCAFile != "" {
		pem, err := os.ReadFile(t.ClientCAFile)
		if err != nil {
			return nil, fmt.Errorf("client CA: %w", err)
		}
		c.ClientCAs = x509.NewCertPool()
		if !c.ClientCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("client CA %s: no PEM certificates", t.ClientCAFile)
		}
		c.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return c, nil
}

// certReloader serves a certificate pair from files, reloading it when they change.
type certReloader struct {
	cert, key string
	clk       clock.Clock
	log       *slog.Logger

	mu      sync.Mutex
	current *tls.Certificate
	stamp   [sha256.Size]byte // the digest of the files' contents when loaded
	checked time.Time
}

// reloadCheckEvery bounds how often a handshake looks at the files.
const reloadCheckEvery = time.Second

// fileStamp digests the files' contents. Their sizes and modification times would not do:
// a renewed certificate is often the same size, and a file's modification time is kept to
// the kernel's clock tick, so a pair written within one tick of the last looks unchanged.
// The files are small and read at most once per reloadCheckEvery.
func (r *certReloader) fileStamp() [sha256.Size]byte {
	h := sha256.New()
	for _, p := range []string{r.cert, r.key} {
		b, _ := os.ReadFile(p) // an unreadable file digests as empty; load reports why
		h.Write(b)
		h.Write([]byte{0})
	}
	var d [sha256.Size]byte
	h.Sum(d[:0])
	return d
}

// load reads the pair. On failure it still records the files' stamp as it was before
// reading, so that the pair is tried again only once the files change after that (a
// certificate and key replaced one after the other may be read half renewed).
func (r *certReloader) load() error {
	stamp := r.fileStamp()
	pair, err := tls.LoadX509KeyPair(r.cert, r.key)
	if err != nil {
		r.mu.Lock()
		r.stamp = stamp
		r.mu.Unlock()
		return fmt.Errorf("TLS certificate: %w", err)
	}
	r.mu.Lock()
	r.current, r.stamp, r.checked = &pair, stamp, r.clk.Now()
	r.mu.Unlock()
	return nil
}

func (r *certReloader) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	now := r.clk.Now()
	r.mu.Lock()
	cur, due := r.current, now.Sub(r.checked) >= reloadCheckEvery
	if due {
		r.checked = now
	}
	stamp := r.stamp
	r.mu.Unlock()
	if due && r.fileStamp() != stamp {
		if err := r.load(); err != nil {
			r.log.Error("TLS certificate not reloaded: serving the previous one", "err", err)
		} else {
			r.log.Info("TLS certificate reloaded", "cert", r.cert)
			r.mu.Lock()
			cur = r.current
			r.mu.Unlock()
		}
	}
	return cur, nil
}

// tokens checks bearer tokens in constant time. Tokens are compared by their SHA-256, so
// that neither their content nor their length leaks through timing.
type tokens [][sha256.Size]byte

func newTokens(list []string) (tokens, error) {
	var t tokens
	for i, s := range list {
		if s = strings.TrimSpace(s); s == "" {
			return nil, fmt.Errorf("auth token %d is empty", i+1)
		}
		t = append(t, sha256.Sum256([]byte(s)))
	}
	return t, nil
}

// ok reports whether header, an Authorization value, carries one of the tokens. The
// scheme's name is case-insensitive (RFC 9110 §11.1: "bearer" is "Bearer"), and one or
// more spaces may follow it.
func (t tokens) ok(header string) bool {
	scheme, tok, found := strings.Cut(header, " ")
	if !found || !strings.EqualFold(scheme, "Bearer") {
		return false
	}
	h := sha256.Sum256([]byte(strings.TrimSpace(tok)))
	match := 0
	for i := range t {
		match |= subtle.ConstantTimeCompare(h[:], t[i][:])
	}
	return match == 1
}

// openPaths stay reachable without a token: orchestrators probe the first two, and the
// API's description holds nothing secret.
var openPaths = map[string]bool{"/healthz": true, "/readyz": true, OpenAPIPath: true}

// unauthorizedProblem is the problem body of a request without a valid token, in the
// form of the HTTP API's other problems.
const unauthorizedProblem = `{"type":"about:blank","title":"Unauthorized","status":401,"detail":"a valid bearer token is required"}`

// requireToken answers 401 to a request without a valid bearer token, except on
// openPaths.
func (t tokens) requireToken(h http.Handler) http.Handler {
	if len(t) == 0 {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !openPaths[r.URL.Path] && !t.ok(r.Header.Get("Authorization")) {
			h := w.Header()
			h.Set("WWW-Authenticate", `Bearer realm="streamlimit"`)
			h.Set("Content-Type", headers.ProblemContentType)
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(unauthorizedProblem))
			return
		}
		h.ServeHTTP(w, r)
	})
}

// grpcHealthPrefix is the standard health service, which stays open like /healthz.
const grpcHealthPrefix = "/grpc.health.v1.Health/"

func (t tokens) grpcAllowed(ctx context.Context, method string) error {
	if strings.HasPrefix(method, grpcHealthPrefix) {
		return nil
	}
	md, _ := metadata.FromIncomingContext(ctx)
	for _, v := range md.Get("authorization") {
		if t.ok(v) {
			return nil
		}
	}
	return status.Error(codes.Unauthenticated, "a valid bearer token is required")
}

// grpcOptions returns the interceptors that require a token, none without tokens.
func (t tokens) grpcOptions() []grpc.ServerOption {
	if len(t) == 0 {
		return nil
	}
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if err := t.grpcAllowed(ctx, info.FullMethod); err != nil {
				return nil, err
			}
			return h(ctx, req)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			if err := t.grpcAllowed(ss.Context(), info.FullMethod); err != nil {
				return err
			}
			return h(srv, ss)
		}),
	}
}
