// Usage reported by a caller that decides requests itself, and the quota this site has
// left for it: for clients that take a share of a limit and decide locally from it (an
// Envoy speaking the Rate Limit Quota Service protocol, package rlqs).

package enforcer

import (
	"context"
	"math"
	"time"
)

// Quota is one global limit in force for a request, as this site stands toward it once
// a Report has counted the caller's usage: the room a caller deciding on its own may
// still take here is Cap − Count, and Later − Count (≤ 0) is what leaves the window over
// the Report's ahead.
type Quota struct {
	// Key is the limit's counter key and Window its counting window.
	Key    string
	Window time.Duration
	// Limit is what the limit admits per Window across all sites (soft raise included;
	// for a pool, the part of it the request's priority may fill).
	Limit int64
	// Cap is the most this site's exact count may reach now: the cap of the global
	// decision (see the package documentation, "Global limits").
	Cap float64
	// Count is this site's exact count now, the reported usage included, and Later the
	// count it will have after ahead if nothing more is counted.
	Count, Later float64
	// Shadow reports that the limit's rule is in shadow mode: counted, never to deny.
	Shadow bool
	// Fallback reports that Cap was decided by a fallback (a stale snapshot or a silent
	// site), as Status.Fallback does for a decision.
	Fallback bool
}

// Report counts usage that the caller decided itself against the global limits in force
// for req (req.Hits is ignored): admitted requests are added to this site's exact count
// without a cap (they were admitted already) and published as hits, denied ones are
// published as demand, as a decision's would be. It then appends to dst each such
// limit's Quota at now, with Later at now + ahead, and returns dst and the number of
// limits in force of local or site scope, which it neither counts nor describes: only a
// global limit's count is shared beyond this process.
//
// Report never fails: a SiteCounter error is logged, and the quotas it concerns are
// marked Fallback with the counts taken as the cap (no room).
func (l *Limiter) Report(ctx context.Context, now time.Time, req Request, admitted, denied int64, ahead time.Duration, dst []Quota) ([]Quota, int) {
	s := l.scratch.Get().(*scratch)
	defer l.scratch.Put(s)
	s.reset()
	var res Result
	l.match(req, &res, s, max(admitted, 1))
	other := len(s.localOps) + len(s.siteOps)
	ops := s.globOps
	if len(ops) == 0 {
		return dst, other
	}
	failed := false
	if admitted > 0 {
		for i := range ops {
			ops[i].N, ops[i].Cap = admitted, math.Inf(1)
		}
		if _, err := l.cfg.Counter.Commit(ctx, now, ops, nil); err != nil {
			l.cfg.Logger.Warn("site counter failed; reported usage not counted here", "err", err)
			failed = true
		}
	}
	if l.cfg.Publisher != nil {
		for i := range ops {
			if admitted > 0 {
				l.cfg.Publisher.Hit(ops[i].Key, ops[i].Window, int(admitted))
			}
			if denied > 0 && !s.globRefs[i].shadow {
				l.cfg.Publisher.Denied(ops[i].Key, ops[i].Window, int(denied))
			}
		}
	}
	if err := l.cfg.Counter.Counts(ctx, now, ops, s.globCount); err != nil {
		l.cfg.Logger.Warn("site counter failed; quotas reported without room", "err", err)
		failed = true
	}
	later := s.globTotal // reused: Report needs no snapshot totals
	if err := l.cfg.Counter.Counts(ctx, now.Add(max(ahead, 0)), ops, later); err != nil {
		failed = true
	}
	for i := range ops {
		q := Quota{Key: ops[i].Key, Window: ops[i].Window, Limit: s.globRefs[i].allowance(), Shadow: s.globRefs[i].shadow}
		q.Cap, _, q.Fallback = l.globalCap(now, &ops[i], q.Limit)
		q.Count, q.Later = s.globCount[i], min(later[i], s.globCount[i])
		if failed {
			q.Count, q.Later, q.Fallback = max(q.Count, q.Cap), max(q.Count, q.Cap), true
		}
		dst = append(dst, q)
	}
	return dst, other
}
