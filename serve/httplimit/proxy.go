package httplimit

import (
	"errors"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/url"
)

// NewProxy returns a reverse proxy to upstream behind mw: a denied request is answered
// 429 by mw and never reaches upstream; an admitted one is forwarded unchanged (method,
// path, query, body and headers, except hop-by-hop fields) with the RateLimit fields on
// the response, and X-Forwarded-For, X-Forwarded-Host and X-Forwarded-Proto set. A
// client's own X-Forwarded-For is kept (and extended) only when its peer is one of mw's
// trusted proxies; otherwise it is replaced, so that upstream cannot be fooled either.
// The upstream's Host is upstream.Host, as nginx's proxy_pass does. An unreachable
// upstream is answered 502.
func NewProxy(upstream *url.URL, mw *Middleware) http.Handler {
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(upstream)
			if xff := pr.In.Header["X-Forwarded-For"]; len(xff) > 0 && mw.cfg.isTrusted(peerAddr(pr.In)) {
				pr.Out.Header["X-Forwarded-For"] = append([]string(nil), xff...)
			}
			pr.SetXForwarded()
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if !errors.Is(err, r.Context().Err()) {
				mw.log.LogAttrs(r.Context(), slog.LevelWarn, "upstream request failed", slog.String("upstream", upstream.Redacted()), slog.Any("err", err))
			}
			writeProblem(w, http.StatusBadGateway, mw.problem, "the upstream service is unreachable")
		},
	}
	return mw.Handler(rp)
}
