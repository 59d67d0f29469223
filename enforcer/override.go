package enforcer

import (
	"time"

	"github.com/streamlimit/streamlimit/enforcer/rules"
)

// Override is a caller's own limit for one descriptor, Envoy's per-descriptor
// RateLimitOverride: Requests per Window in place of the limits of the rule the descriptor
// matches, as envoyproxy/ratelimit honours it.
//
// In a domain the rules configure, an overridden descriptor is limited by
// rules.Override(…): the matched rule's first limit gives the scope and the algorithm, and
// without a matched rule (or with an unlimited one) the defaults do (global,
// sliding_window). The rule's other limits, its shadow mode and its replaces are not in
// force for that descriptor, and its Status carries no Rule; the limit has its own counter
// key (rules.AppendOverrideKey), per descriptor and window, so it never shares a count
// with the rule. The pools that the rule's limits name stay in force, at the rule's
// priority: the request counts toward them, and is denied when one is full, since a pool
// is capacity that every descriptor naming it shares. Requests 0 admits nothing. In a
// domain the rules do not configure, the override limits nothing, as no rule would. A
// decision with an override allocates its limit.
//
// An override lets a caller choose its own quota; a front door that does not trust its
// callers to do so leaves Request.Overrides nil.
type Override struct {
	// Requests is the number of requests admitted per Window.
	Requests int64
	// Window is the override's window; 0 means the descriptor has no override.
	Window time.Duration
}

// overridden reports whether descriptor d of req carries an override in force (its
// domain is configured), and if so adds the operation of its limit to s; r is the rule the
// descriptor matched, or nil.
func (l *Engine) overridden(cfg *rules.Config, req Request, d int, r *rules.Rule, s *scratch, n int64) bool {
	if d >= len(req.Overrides) || req.Overrides[d].Window <= 0 || !cfg.HasDomain(req.Domain) {
		return false
	}
	o := req.Overrides[d]
	entries := req.Descriptors[d]
	lim := rules.Override(req.Domain, r, entries, o.Requests, o.Window)
	s.buf = rules.AppendOverrideKey(s.buf[:0], req.Domain, entries, lim)
	h := l.keys.handle(s.buf, lim.Scope == rules.Global)
	l.addOp(s, opRef{desc: d, limit: lim, key: h.key, h: h}, n)
	if r != nil && !r.Unlimited {
		// A pool is capacity shared by every descriptor that names it: a caller that
		// chooses its own quota still spends the pool's.
		for i := range r.Limits {
			if p := r.Limits[i].Pool; p != nil {
				s.overPools = append(s.overPools, overPool{desc: d, rule: r, pool: p})
			}
		}
	}
	return true
}
