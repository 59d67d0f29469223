package httplimit

import (
	"net/http"
	"net/netip"
	"net/url"
	"strings"

	"github.com/streamlimit/streamlimit/enforcer/rules"
)

// view is what descriptor extraction reads of a request: the request itself for the
// middleware, or the headers nginx forwards for the auth_request endpoint.
type view struct {
	method   string
	path     string
	rawQuery string
	pattern  string
	header   http.Header
	// client is the client address already resolved (auth endpoint), or invalid to
	// resolve it from peer and the forwarding headers.
	client netip.Addr
	peer   netip.Addr
}

// build appends the request's descriptors to s.descs, using s.entries and s.buf as
// storage. It allocates only the one string that holds the client address, if needed.
func (c *compiled) build(s *state, v *view) {
	s.descs = s.descs[:0]
	if cap(s.entries) < c.entries {
		s.entries = make([]rules.Entry, 0, c.entries)
	}
	s.entries = s.entries[:0]
	ip := ""
	ipDone := false
	for _, srcs := range c.descs {
		start := len(s.entries)
		ok := true
		for i := range srcs {
			src := &srcs[i]
			var val string
			found := true
			switch src.kind {
			case SourceRemoteAddress:
				if !ipDone {
					ip, ipDone = c.clientValue(s, v), true
				}
				val, found = ip, ip != ""
			case SourceHeader:
				val, found = firstHeader(v.header, src.name)
			case SourceMethod:
				val, found = v.method, v.method != ""
			case SourcePath:
				val, found = v.path, v.path != ""
			case SourceRoute:
				val, found = route(src, v)
			case SourceQuery:
				val, found = queryParam(v.rawQuery, src.name)
			case SourceGenericKey:
				val = src.value
			}
			if !found {
				if src.skipIfAbsent {
					continue
				}
				ok = false
				break
			}
			s.entries = append(s.entries, rules.Entry{Key: src.key, Value: val})
		}
		if !ok || len(s.entries) == start {
			s.entries = s.entries[:start]
			continue
		}
		s.descs = append(s.descs, s.entries[start:len(s.entries):len(s.entries)])
	}
}

func firstHeader(h http.Header, name string) (string, bool) {
	vs := h[name]
	if len(vs) == 0 {
		return "", false
	}
	return vs[0], true
}

// route returns the ServeMux pattern, else the longest configured prefix of the path.
func route(src *source, v *view) (string, bool) {
	if v.pattern != "" {
		return v.pattern, true
	}
	for _, p := range src.prefixes {
		if strings.HasPrefix(v.path, p) && (len(v.path) == len(p) || p[len(p)-1] == '/' || v.path[len(p)] == '/') {
			return p, true
		}
	}
	return "", false
}

// queryParam returns the first value of query parameter name in raw, decoded, without
// allocating unless the value is escaped. A value that does not decode is absent.
func queryParam(raw, name string) (string, bool) {
	for raw != "" {
		var pair string
		pair, raw, _ = strings.Cut(raw, "&")
		k, val, _ := strings.Cut(pair, "=")
		if k != name {
			if !strings.ContainsAny(k, "%+") {
				continue
			}
			if uk, err := url.QueryUnescape(k); err != nil || uk != name {
				continue
			}
		}
		uv, err := url.QueryUnescape(val)
		if err != nil {
			return "", false
		}
		return uv, true
	}
	return "", false
}

// clientValue renders the grouped client address, e.g. "192.0.2.7" or "2001:db8::/64".
func (c *compiled) clientValue(s *state, v *view) string {
	a := v.client
	if !a.IsValid() {
		a = c.clientIP(v.peer, v.header)
	}
	if !a.IsValid() {
		return ""
	}
	bits := c.v4
	if a.Is6() {
		bits = c.v6
	}
	s.buf = s.buf[:0]
	if bits == a.BitLen() {
		s.buf = a.AppendTo(s.buf)
	} else {
		p, err := a.Prefix(bits)
		if err != nil {
			return ""
		}
		s.buf = p.AppendTo(s.buf)
	}
	return string(s.buf)
}

func (c *compiled) isTrusted(a netip.Addr) bool {
	for _, p := range c.trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// ClientIP returns the client address of r: the connection's peer, unless the peer is a
// trusted proxy (Config.TrustedProxies); then Config.ForwardedHeader, and no other header,
// is walked from the right (every header line in order), skipping trusted proxies, and the
// first untrusted address is the client. Walking from the right matters: each proxy
// appends the address it saw, so everything left of the nearest trusted proxy's entry was
// written by the client and proves nothing. If the chain holds only trusted proxies the
// left-most is the client; if an element does not parse (obfuscated, "unknown", garbage),
// the walk stops and the last good address, a trusted proxy, is the client, since nothing
// left of it can be believed. IPv4-mapped IPv6 addresses are returned as IPv4.
func (m *Middleware) ClientIP(r *http.Request) netip.Addr {
	return m.cfg.clientIP(peerAddr(r), r.Header)
}

func peerAddr(r *http.Request) netip.Addr {
	if ap, err := netip.ParseAddrPort(r.RemoteAddr); err == nil {
		return ap.Addr().Unmap()
	}
	if a, err := netip.ParseAddr(r.RemoteAddr); err == nil {
		return a.Unmap()
	}
	return netip.Addr{}
}

func (c *compiled) clientIP(peer netip.Addr, h http.Header) netip.Addr {
	if !peer.IsValid() || !c.isTrusted(peer) {
		return peer
	}
	lines := h[c.fwd]
	if len(lines) == 0 {
		return peer
	}
	if c.fwdRFC {
		return c.walkForwarded(peer, lines)
	}
	return c.walkXFF(peer, lines)
}

func (c *compiled) walkXFF(cur netip.Addr, lines []string) netip.Addr {
	for i := len(lines) - 1; i >= 0; i-- {
		rest := lines[i]
		for rest != "" {
			var tok string
			if j := strings.LastIndexByte(rest, ','); j >= 0 {
				tok, rest = rest[j+1:], rest[:j]
			} else {
				tok, rest = rest, ""
			}
			tok = strings.TrimSpace(tok)
			if tok == "" {
				continue
			}
			var end bool
			if cur, end = c.step(cur, tok); end {
				return cur
			}
		}
	}
	return cur
}

// step takes a walk of the forwarding headers one hop left, to node: it returns the
// address the walk is at and whether the walk ends there — at cur, the last address
// believed, when node does not parse; at node's address when it is not a trusted proxy.
func (c *compiled) step(cur netip.Addr, node string) (netip.Addr, bool) {
	a, ok := parseNode(node)
	if !ok {
		return cur, true
	}
	return a, !c.isTrusted(a)
}

// parseNode parses an address as forwarding headers write it: "192.0.2.1",
// "192.0.2.1:443", "2001:db8::1", "[2001:db8::1]" or "[2001:db8::1]:443".
func parseNode(s string) (netip.Addr, bool) {
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Unmap(), true
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap(), true
	}
	if len(s) > 2 && s[0] == '[' && s[len(s)-1] == ']' {
		if a, err := netip.ParseAddr(s[1 : len(s)-1]); err == nil && a.Is6() {
			return a.Unmap(), true
		}
	}
	return netip.Addr{}, false
}
