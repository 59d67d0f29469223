// Package httplimit puts a streamlimit enforcer in front of HTTP handlers: a net/http
// middleware, a JSON check API (POST /v1/check), an endpoint for nginx's auth_request
// module, and a reverse proxy for services that cannot change their code.
//
// All of them turn a request into enforcer descriptors by a Config (client address,
// headers, method, path or route, query parameters, constants), decide with an
// enforcer.Engine, and answer a denied request with 429, the fields of package headers
// and an RFC 9457 application/problem+json body. The client address is the peer's unless
// it is one of Config.TrustedProxies (see Middleware.ClientIP); IPv6 clients are grouped
// by Config.IPv6Prefix. The answers, field by field: docs/api.md.
package httplimit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"sync"

	"github.com/streamlimit/streamlimit/enforcer"
	"github.com/streamlimit/streamlimit/enforcer/rules"
	"github.com/streamlimit/streamlimit/serve/headers"
)

// Decider decides a request; *enforcer.Engine is one. DecideInto must be safe for
// simultaneous use and should not allocate.
type Decider interface {
	DecideInto(ctx context.Context, req enforcer.Request, res *enforcer.Result)
}

// Options configure a Middleware.
type Options struct {
	// Config says how requests become descriptors. Required (Domain and Descriptors).
	Config Config
	// Mux, when set, supplies the route pattern (its Handler method) for requests that
	// reach the middleware before the mux has routed them, i.e. when the middleware wraps
	// the whole mux. Default nil: the route is Request.Pattern, which is set when the
	// middleware wraps a handler registered on a mux, else Source.Prefixes.
	Mux *http.ServeMux
	// Logger receives one Warn record per shadow-mode limit that would have denied, and
	// errors writing responses. Default: discard.
	Logger *slog.Logger
	// ProblemType is the "type" member of problem bodies. Default "about:blank", which
	// RFC 9457 defines as "no more than the HTTP status", hence the title "Too Many
	// Requests".
	ProblemType string
}

// Middleware rate-limits HTTP requests with a Decider. Create it with New; it is safe for
// simultaneous use by multiple goroutines. On the admitted path it allocates only the
// string of the client address (when a descriptor uses it) and the RateLimit field
// values (one string and one slice).
type Middleware struct {
	dec     Decider
	cfg     *compiled
	mux     *http.ServeMux
	log     *slog.Logger
	problem string
	pool    sync.Pool // *state
}

// state is one request's working memory.
type state struct {
	descs   [][]rules.Entry
	entries []rules.Entry
	buf     []byte
	res     enforcer.Result
	vals    headers.Values
}

// New returns a Middleware that decides with dec. It returns a *ConfigError when
// opts.Config is invalid.
func New(dec Decider, opts Options) (*Middleware, error) {
	if dec == nil {
		return nil, errors.New("httplimit: nil Decider")
	}
	c, err := compile(opts.Config)
	if err != nil {
		return nil, err
	}
	m := &Middleware{dec: dec, cfg: c, mux: opts.Mux, log: opts.Logger, problem: opts.ProblemType}
	if m.log == nil {
		m.log = slog.New(slog.DiscardHandler)
	}
	if m.problem == "" {
		m.problem = "about:blank"
	}
	m.pool.New = func() any { return new(state) }
	return m, nil
}

// Domain returns the rules domain the Middleware decides in.
func (m *Middleware) Domain() string { return m.cfg.domain }

// Wrap is Handler, in the shape func(http.Handler) http.Handler.
func (m *Middleware) Wrap(next http.Handler) http.Handler { return m.Handler(next) }

// Handler returns a handler that decides each request before next sees it. A denied
// request gets 429 with the rate-limit fields and a problem body and never reaches next;
// an admitted one reaches next with the RateLimit fields already set on the response.
// A request for which the Config yields no descriptor is passed on untouched.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v := view{method: r.Method, path: r.URL.Path, rawQuery: r.URL.RawQuery, pattern: r.Pattern, header: r.Header, peer: peerAddr(r)}
		if v.pattern == "" && m.mux != nil {
			_, v.pattern = m.mux.Handler(r)
		}
		s := m.pool.Get().(*state)
		if !m.decide(r.Context(), s, &v, w.Header()) {
			m.writeDenied(w, r, &s.res, http.StatusTooManyRequests)
			m.pool.Put(s)
			return
		}
		m.pool.Put(s)
		next.ServeHTTP(w, r)
	})
}

// decide builds the descriptors of v, decides, sets the rate-limit fields on h and logs
// shadow denials. It reports whether the request is admitted.
func (m *Middleware) decide(ctx context.Context, s *state, v *view, h http.Header) bool {
	m.cfg.build(s, v)
	if len(s.descs) == 0 {
		s.res.Code, s.res.Statuses = enforcer.CodeOK, s.res.Statuses[:0]
		return true
	}
	m.dec.DecideInto(ctx, enforcer.Request{Domain: m.cfg.domain, Descriptors: s.descs, Hits: 1}, &s.res)
	setFields(h, &s.vals, &s.res)
	for i := range s.res.Statuses {
		if st := &s.res.Statuses[i]; st.Shadow {
			m.logShadow(ctx, v, st)
		}
	}
	return s.res.Code != enforcer.CodeOverLimit
}

// canonical are the field names of package headers in http.Header's canonical form, so
// that Header.Get and later Set calls by the handler find them.
var canonical = [headers.MaxFields]string{
	http.CanonicalHeaderKey(headers.RateLimitPolicy),
	http.CanonicalHeaderKey(headers.RateLimit),
	http.CanonicalHeaderKey(headers.XRateLimitLimit),
	http.CanonicalHeaderKey(headers.XRateLimitRemain),
	http.CanonicalHeaderKey(headers.XRateLimitReset),
	http.CanonicalHeaderKey(headers.RetryAfter),
}

// setFields renders res into h with two allocations: one string holding every value and
// one slice backing every field's []string.
func setFields(h http.Header, vals *headers.Values, res *enforcer.Result) {
	n := vals.Render(res)
	if n == 0 {
		return
	}
	all := string(vals.Bytes())
	backing := make([]string, n)
	for i := range n {
		s, e := vals.Span(i)
		backing[i] = all[s:e]
		h[canonical[i]] = backing[i : i+1 : i+1]
	}
}

func (m *Middleware) logShadow(ctx context.Context, v *view, st *enforcer.Status) {
	rule := ""
	if st.Rule != nil {
		rule = st.Rule.ID
	}
	m.log.LogAttrs(ctx, slog.LevelWarn, "shadow rate limit exceeded; request admitted",
		slog.String("domain", m.cfg.domain),
		slog.String("rule", rule),
		slog.String("policy", headers.PolicyName(st)),
		slog.String("key", st.Key),
		slog.Int64("limit", st.Requests),
		slog.Duration("window", st.Window),
		slog.String("method", v.method),
		slog.String("path", v.path))
}

// Problem is the RFC 9457 problem body of a denied request.
type Problem struct {
	// Type is Options.ProblemType.
	Type string `json:"type"`
	// Title is the status text, "Too Many Requests".
	Title string `json:"title"`
	// Status is the response's status code.
	Status int `json:"status"`
	// Detail says which policy was exceeded, in English.
	Detail string `json:"detail"`
	// Policy is the policy's name as in the RateLimit fields (headers.PolicyName).
	Policy string `json:"policy,omitempty"`
	// Rule is the ID of the rule that matched (rules.Rule.ID).
	Rule string `json:"rule,omitempty"`
	// Limit is the number of requests the policy admits per window.
	Limit int64 `json:"limit"`
	// WindowSeconds is the policy's window, rounded up to whole seconds.
	WindowSeconds int64 `json:"window_seconds"`
	// RetryAfterSeconds equals the Retry-After field.
	RetryAfterSeconds int64 `json:"retry_after_seconds"`
}

// NewProblem describes the denial of res with the given status code and problem type.
// The rate-limit fields of res are set separately (package headers).
func NewProblem(res *enforcer.Result, status int, typ string) Problem {
	p := Problem{Type: typ, Title: http.StatusText(status), Status: status}
	st := headers.Primary(res)
	if st == nil {
		p.Detail = "rate limit exceeded"
		p.RetryAfterSeconds = 1
		return p
	}
	p.Policy = headers.PolicyName(st)
	if st.Rule != nil {
		p.Rule = st.Rule.ID
	}
	p.Limit = st.Requests
	p.WindowSeconds = headers.Seconds(st.Window)
	p.RetryAfterSeconds = max(headers.Seconds(st.RetryAfter), 1)
	p.Detail = fmt.Sprintf("rate limit %q of rule %s exceeded: %d requests per %d s; retry in %d s",
		p.Policy, p.Rule, p.Limit, p.WindowSeconds, p.RetryAfterSeconds)
	return p
}

// writeDenied writes status with a problem body. The rate-limit fields are already set.
func (m *Middleware) writeDenied(w http.ResponseWriter, r *http.Request, res *enforcer.Result, status int) {
	body, err := json.Marshal(NewProblem(res, status, m.problem))
	if err != nil { // cannot happen: the struct has only strings and integers
		body = []byte(`{"title":"Too Many Requests","status":429}`)
	}
	h := w.Header()
	h.Set("Content-Type", headers.ProblemContentType)
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	if r.Method == http.MethodHead {
		return
	}
	if _, err := w.Write(body); err != nil {
		m.log.LogAttrs(r.Context(), slog.LevelDebug, "writing 429 body", slog.Any("err", err))
	}
}
