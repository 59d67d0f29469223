package enforcer

import (
	"context"
	"time"

	"github.com/streamlimit/streamlimit/enforcer/algo"
	"github.com/streamlimit/streamlimit/enforcer/rules"
	"github.com/streamlimit/streamlimit/enforcer/sitestore"
)

// envoyCounter is a SiteStore that also keeps counters in envoyproxy/ratelimit's own Redis
// layout (*sitestore.Store). CountEnvoy is the one place where the limits that
// rules.Limit.EnvoyShared names are counted, from the Engine's decisions (the check API,
// /v1/auth, the middleware, the proxy) and from package rls's answers (the gRPC service,
// /json) alike.
type envoyCounter interface {
	CountEnvoy(ctx context.Context, now time.Time, incrs []sitestore.EnvoyIncr, out []int64) (fellBack bool)
}

// envoyShared reports whether lim, in a request to a domain in rules.CompatEnvoy, is
// counted in envoyproxy/ratelimit's layout (own: it is the one limit in force of its
// descriptor).
func (l *Engine) envoyShared(lim *rules.Limit, own bool) bool {
	return own && l.envoy != nil && lim.EnvoyShared()
}

// commitEnvoy counts the request's limits kept in envoyproxy/ratelimit's layout
// (s.envoyRefs), before any other stage: as there, each takes the hits over its limit or
// not, and the request is refused when one is over its limit after them (a shadow one is
// reported only). It reports whether they admit the request.
func (l *Engine) commitEnvoy(ctx context.Context, now time.Time, req Request, s *scratch, n int64) bool {
	if len(s.envoyRefs) == 0 {
		return true
	}
	s.envoyIncrs = s.envoyIncrs[:0]
	for _, ref := range s.envoyRefs {
		s.buf, _ = rules.AppendEnvoyKey(s.buf[:0], l.cfg.EnvoyKeyPrefix, req.Domain, req.Descriptors[ref.desc], s.matched[ref.desc], ref.limit, now)
		s.envoyIncrs = append(s.envoyIncrs, sitestore.EnvoyIncr{Key: string(s.buf), N: n, Expire: ref.limit.Window})
	}
	s.envoyCounts = grow(s.envoyCounts, len(s.envoyIncrs))
	s.envoyOut = grow(s.envoyOut, len(s.envoyIncrs))
	if s.envoyFellBack = l.envoy.CountEnvoy(ctx, now, s.envoyIncrs, s.envoyCounts); s.envoyFellBack {
		l.metrics.fallback.WithLabelValues("redis").Inc()
	}
	ok := true
	for i, ref := range s.envoyRefs {
		limit, count, w := ref.limit.Algo().Allowance(), s.envoyCounts[i], ref.limit.Window
		reset := time.Duration(now.UnixNano()/int64(w)+1)*w - time.Duration(now.UnixNano())
		d := algo.Decision{Allowed: count <= limit, Limit: limit, Remaining: max(limit-count, 0), ResetAfter: reset}
		if !d.Allowed {
			d.RetryAfter = reset
			ok = ok && ref.shadow
		}
		s.envoyOut[i] = d
	}
	return ok
}
