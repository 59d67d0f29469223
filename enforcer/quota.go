// Usage reported by a caller that decides requests itself, and the quota this site has
// left for it: for clients that take a share of a limit and decide locally from it (an
// Envoy speaking the Rate Limit Quota Service protocol, package rlqs).

package enforcer

import (
	"context"
	"math"
	"time"

	"github.com/streamlimit/streamlimit/enforcer/rules"
	"github.com/streamlimit/streamlimit/enforcer/sitecount"
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
	// decision (docs/decisions.md, "Global limits").
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

// Reporter reports the usage of one request's limits again and again (an RLQS bucket's,
// every reporting interval): it matches the request against the rules once, and again
// only when the rules change. A Reporter is not safe for simultaneous use.
type Reporter struct {
	l     *Engine
	req   Request
	cfg   *rules.Config // the rules ops were matched with
	ops   []sitecount.Op
	refs  []opRef
	other int
	later []float64
}

// Reporter returns a Reporter of req's usage (req.Hits is ignored).
func (l *Engine) Reporter(req Request) *Reporter { return &Reporter{l: l, req: req} }

// Report counts usage that the caller decided itself against the global limits in force
// for the Reporter's request: admitted requests are added to this site's exact count
// without a cap (they were admitted already) and published as hits, denied ones are
// published as demand, as a decision's would be. It then appends to dst each such
// limit's Quota at now, with Later at now + ahead, and returns dst and the number of
// limits in force of local or site scope, which it neither counts nor describes: only a
// global limit's count is shared beyond this process. ahead is taken to be the caller's
// reporting period too: the usage over it is the rate by which this site's share of a
// global limit's room is weighed, at least (the snapshot shows a report's demand only as
// a lump that fades within seconds).
//
// Report never fails: a sitecount.Counter error is logged, and the quotas it concerns are
// marked Fallback with the counts taken as the cap (no room).
func (r *Reporter) Report(ctx context.Context, now time.Time, admitted, denied int64, ahead time.Duration, dst []Quota) ([]Quota, int) {
	l := r.l
	if cfg := l.cfg.Rules(); cfg != r.cfg || r.cfg == nil {
		r.match(cfg)
	}
	ops := r.ops
	if len(ops) == 0 {
		return dst, r.other
	}
	n := len(ops)
	if cap(r.later) < 2*n {
		r.later = make([]float64, 2*n)
	}
	counts, later := r.later[:n], r.later[n:2*n]
	failed := false
	for i := range ops {
		ops[i].N, ops[i].Cap = admitted, math.Inf(1)
	}
	if admitted > 0 {
		// The counts before the usage come back with the commit; the usage is added to
		// the bucket of now, which a count at now takes whole.
		if _, err := l.cfg.Counter.Commit(ctx, now, ops, counts); err != nil {
			l.cfg.Logger.Warn("site counter failed; reported usage not counted here", "err", err)
			failed = true
		}
		for i := range counts {
			counts[i] += float64(admitted)
		}
	} else if err := l.cfg.Counter.Counts(ctx, now, ops, counts); err != nil {
		l.cfg.Logger.Warn("site counter failed; quotas reported without room", "err", err)
		failed = true
	}
	if err := l.cfg.Counter.Counts(ctx, now.Add(max(ahead, 0)), ops, later); err != nil {
		failed = true
	}
	p := l.cfg.ReportPublisher
	if p == nil {
		p = l.cfg.Publisher
	}
	if p != nil {
		for i := range ops {
			if admitted > 0 {
				p.Hit(ops[i].Key, ops[i].Window, int(admitted))
			}
			if denied > 0 && !r.refs[i].shadow {
				p.Denied(ops[i].Key, ops[i].Window, int(denied))
			}
		}
	}
	// The demand the report stands for, in the snapshot's terms: its requests over the
	// period they were counted in (ahead, the caller's reporting period), times τ
	// (withDemand).
	reported := float64(admitted+max(denied, 0)) * demandTau / float64(max(ahead.Milliseconds(), 1))
	for i := range ops {
		ref := &r.refs[i]
		if ref.limit.Elastic != nil && !ref.pooled {
			ref.allow = l.elastic(ref.limit) // it moves with its pool's use
		}
		q := Quota{Key: ops[i].Key, Window: ops[i].Window, Limit: ref.allowance(), Shadow: ref.shadow}
		q.Cap, _, q.Fallback = l.globalCap(now, &ops[i], ref.h, q.Limit, ahead, reported)
		q.Count, q.Later = counts[i], min(later[i], counts[i])
		if failed {
			q.Count, q.Later, q.Fallback = max(q.Count, q.Cap), max(q.Count, q.Cap), true
		}
		dst = append(dst, q)
	}
	return dst, r.other
}

// match finds the global limits in force for the request under cfg.
func (r *Reporter) match(cfg *rules.Config) {
	l := r.l
	s := l.scratch.Get().(*scratch)
	defer l.scratch.Put(s)
	s.reset()
	var res Result
	l.match(r.req, &res, s, 1)
	r.cfg = cfg
	r.other = len(s.localOps) + len(s.siteOps)
	r.ops = append(r.ops[:0], s.globOps...)
	r.refs = append(r.refs[:0], s.globRefs...)
}
