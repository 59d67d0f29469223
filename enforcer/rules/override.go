package rules

import (
	"strings"
	"time"
)

// overrideMark ends the counter key of an override. A rule's key ends with its window tag
// after '#', which never holds '|', so no rule's key ends with it.
const overrideMark = "|override"

// HasDomain reports whether c configures domain. It is false on a nil Config.
func (c *Config) HasDomain(domain string) bool {
	return c != nil && c.domains[domain] != nil
}

// UnitDuration returns the duration of an envoyproxy/ratelimit unit named in lower case
// ("second" … "year"), and whether there is such a unit.
func UnitDuration(name string) (time.Duration, bool) {
	for _, u := range units {
		if u.name == name {
			return u.d, true
		}
	}
	return 0, false
}

// Override returns the limit that a caller's own limit for one descriptor (Envoy's
// per-descriptor RateLimitOverride) puts in force instead of the rules': requests per
// window, decided in the scope and with the algorithm (and hard) of the first limit of r,
// the rule the descriptor matched, else in DefaultScope with DefaultAlgorithm. Nothing
// else of the rule carries over: no burst (a bucket holds requests), soft raise, pool,
// elastic range, replaces or shadow mode, as envoyproxy/ratelimit builds its override
// without them. Its Name, the policy name of the RateLimit fields, is the rule's ID (else
// the domain and the entries' keys joined by '.') followed by "-override-" and the window
// tag, so that clients tell it from the rule's own limits. entries are the descriptor's.
func Override(domain string, r *Rule, entries []Entry, requests int64, window time.Duration) *Limit {
	l := &Limit{Requests: requests, Window: window, Algorithm: DefaultAlgorithm, Scope: DefaultScope, tag: windowTag(window)}
	for _, u := range units {
		if u.d == window {
			l.Unit = u.name
		}
	}
	var name strings.Builder
	if r != nil {
		if len(r.Limits) > 0 {
			base := &r.Limits[0]
			l.Scope, l.Algorithm, l.Hard = base.Scope, base.Algorithm, base.Hard
		}
		name.WriteString(r.ID)
	} else {
		name.WriteString(domain)
		for _, e := range entries {
			name.WriteByte('.')
			name.WriteString(e.Key)
		}
	}
	name.WriteString("-override-")
	name.WriteString(l.tag)
	l.Name = name.String()
	return l
}

// AppendOverrideKey appends to dst the counter key of an override limit lim (see
// Override) for the descriptor entries of domain: the key a rule would have for these
// entries and lim's window, with the request's own values (share_threshold does not apply,
// as no rule's pattern does), followed by "|override":
//
//	api|user=42#60s|override
//
// It never equals a rule's key, so an override and the rules never share a count. It does
// not depend on lim's number of requests: a caller that changes the number keeps its count.
func AppendOverrideKey(dst []byte, domain string, entries []Entry, lim *Limit) []byte {
	start := len(dst)
	dst = appendEscaped(dst, domain)
	for _, e := range entries {
		dst = append(dst, '|')
		dst = appendEscaped(dst, e.Key)
		dst = append(dst, '=')
		dst = appendEscaped(dst, e.Value)
	}
	dst = append(dst, '#')
	dst = append(dst, lim.tag...)
	dst = append(dst, overrideMark...)
	return boundKey(dst, start, 1+len(lim.tag)+len(overrideMark))
}
