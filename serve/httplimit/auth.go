package httplimit

import (
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
)

// AuthOptions configure the nginx auth_request endpoint. The repository's docs/api.md shows
// an nginx configuration that uses it.
type AuthOptions struct {
	// DeniedStatus answers a denied request. Default DefaultDeniedStatus (429). nginx's auth_request treats
	// only 2xx, 401 and 403 as answers (anything else is an error, 500), so behind nginx
	// use 403 and turn it back into 429 with error_page; a request's ?status=401, 403 or
	// 429 overrides it, so one server can serve both (another ?status is a 400).
	DeniedStatus int
	// ClientIPHeader carries the client address nginx saw ($remote_addr). Default
	// "X-Real-IP". It is the only header the endpoint reads an address from, and it is
	// believed only from a peer in Config.TrustedProxies (nginx): anyone else who can reach
	// the endpoint could otherwise name a new client address on every request. A list
	// ($proxy_add_x_forwarded_for) is walked from the right past trusted proxies, as the
	// middleware walks Config.ForwardedHeader. When the peer is not trusted, or the header
	// is absent or does not parse (nginx writes "unix:" for a client on a Unix socket), the
	// client is the peer. Config.ForwardedHeader is never read here: nginx copies the
	// client's own headers into the subrequest, so an X-Forwarded-For there may be the
	// client's.
	ClientIPHeader string
	// URIHeader carries the original request URI with its query ($request_uri). Default
	// "X-Original-URI". The path and query sources read it; absent, they have no value.
	URIHeader string
	// MethodHeader carries the original method ($request_method). Default
	// "X-Original-Method"; absent, the method source has no value.
	MethodHeader string
}

// AuthHandler returns an endpoint for nginx's auth_request module, deciding with m's
// Decider and Config but reading the original request from the headers nginx forwards:
// the client address from ClientIPHeader, method from MethodHeader, path and query from
// URIHeader, and header sources from the subrequest's headers (nginx copies the original
// request's headers into the subrequest). Route sources use Source.Prefixes.
//
// DefaultDeniedStatus is AuthOptions.DeniedStatus when zero.
const DefaultDeniedStatus = http.StatusTooManyRequests

// An admitted request is answered 204 No Content, a denied one DeniedStatus with a problem
// body; both carry the rate-limit fields, which nginx can copy with auth_request_set. A
// method other than GET, HEAD and POST is answered 405, a ?status other than 401, 403 and
// 429 400. The endpoint believes ClientIPHeader only from trusted proxies, so list nginx's
// address in Config.TrustedProxies.
func (m *Middleware) AuthHandler(opts AuthOptions) http.Handler {
	if opts.DeniedStatus == 0 {
		opts.DeniedStatus = DefaultDeniedStatus
	}
	if opts.ClientIPHeader == "" {
		opts.ClientIPHeader = "X-Real-IP"
	}
	if opts.URIHeader == "" {
		opts.URIHeader = "X-Original-URI"
	}
	if opts.MethodHeader == "" {
		opts.MethodHeader = "X-Original-Method"
	}
	ipH := http.CanonicalHeaderKey(opts.ClientIPHeader)
	ipRFC := ipH == "Forwarded"
	uriH := http.CanonicalHeaderKey(opts.URIHeader)
	methodH := http.CanonicalHeaderKey(opts.MethodHeader)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case http.MethodGet, http.MethodHead, http.MethodPost:
		default:
			// auth_request's subrequests are GET; POST is the API's other spelling.
			w.Header().Set("Allow", "GET, HEAD, POST")
			writeProblem(w, http.StatusMethodNotAllowed, "about:blank", "use GET or POST")
			return
		}
		status := opts.DeniedStatus
		if q, ok := r.URL.Query()["status"]; ok {
			n, err := strconv.Atoi(q[0])
			if err != nil || len(q) > 1 || n != 401 && n != 403 && n != 429 {
				writeProblem(w, http.StatusBadRequest, "about:blank", "status: want one of 401, 403 and 429")
				return
			}
			status = n
		}
		v := view{header: r.Header, peer: peerAddr(r)}
		v.method, _ = firstHeader(r.Header, methodH)
		if uri, ok := firstHeader(r.Header, uriH); ok {
			p, q, _ := strings.Cut(uri, "?")
			if strings.IndexByte(p, '%') >= 0 {
				if up, err := url.PathUnescape(p); err == nil {
					p = up
				}
			}
			v.path, v.rawQuery = p, q
		}
		v.client = v.peer
		if v.peer.IsValid() && m.cfg.isTrusted(v.peer) {
			if ipRFC {
				v.client = m.cfg.walkForwarded(v.peer, r.Header[ipH])
			} else {
				v.client = m.cfg.walkXFF(v.peer, r.Header[ipH])
			}
		}
		if v.client.IsValid() {
			v.client = v.client.Unmap()
		} else {
			v.client = netip.Addr{}
		}
		s := m.pool.Get().(*state)
		defer m.pool.Put(s)
		if !m.decide(r.Context(), s, &v, w.Header()) {
			m.writeDenied(w, r, &s.res, status)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
}
