package enforcer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/streamlimit/streamlimit/enforcer/algo"
	"github.com/streamlimit/streamlimit/enforcer/rules"
)

// ErrNotShapeable is returned by Reserve and Wait for a request that does not have
// exactly one limit in force, of local scope: site and global limits are decided where
// they are counted, not queued in this process, and a queue position cannot be given
// back, so a request is shaped by one limit only.
var ErrNotShapeable = errors.New("enforcer: request cannot be shaped: it needs exactly one limit in force, of local scope")

// Reserve is Decide for traffic shaping (the leaky bucket as a queue): when the request's
// limit is a leaky_bucket, token_bucket or gcra limit of local scope whose bucket is
// full, the request is queued instead of denied, and Reserve returns how long the caller
// must wait before acting so that requests leave at the limit's rate. A request whose
// wait would exceed maxDelay, or whose queue is full, is denied and takes nothing, as with
// Decide. With a window algorithm Reserve is Decide with a delay of 0.
//
// The request must have exactly one limit in force, of local scope; otherwise Reserve
// returns ErrNotShapeable and decides nothing.
func (l *Limiter) Reserve(ctx context.Context, req Request, maxDelay time.Duration) (time.Duration, Result, error) {
	now := l.cfg.Clock.Now()
	op, ref, res, err := l.shapeOp(req)
	if err != nil {
		return 0, res, err
	}
	delay, d := l.cfg.Local.Reserve(now, op, maxDelay)
	st := &res.Statuses[ref.desc]
	st.Limit, st.Key, st.Requests, st.Window = ref.limit, ref.key, d.Limit, ref.limit.Window
	st.Remaining, st.ResetAfter = d.Remaining, d.ResetAfter
	if !d.Allowed {
		st.Code, res.Code = CodeOverLimit, CodeOverLimit
		st.RetryAfter = max(d.RetryAfter, time.Nanosecond)
	}
	l.metrics.observe(req.Domain, &res)
	return delay, res, nil
}

// Wait is Reserve followed by sleeping the delay on a real timer, or until ctx is done.
// maxDelay is further bounded by ctx's deadline. When the sleep is cut short, the queued
// slot stays taken (the queue does not move backwards) and ctx's error is returned.
func (l *Limiter) Wait(ctx context.Context, req Request, maxDelay time.Duration) (Result, error) {
	if dl, ok := ctx.Deadline(); ok {
		maxDelay = min(maxDelay, time.Until(dl))
	}
	delay, res, err := l.Reserve(ctx, req, maxDelay)
	if err != nil || res.Code != CodeOK || delay <= 0 {
		return res, err
	}
	return res, algo.Sleep(ctx, delay)
}

// shapeOp finds the one local limit a shaped request may have.
func (l *Limiter) shapeOp(req Request) (algo.Op, opRef, Result, error) {
	n := req.Hits
	if n <= 0 {
		n = 1
	}
	res := Result{Code: CodeOK, Statuses: make([]Status, len(req.Descriptors))}
	cfg := l.cfg.Rules()
	matched := make([]*rules.Rule, len(req.Descriptors))
	for i, entries := range req.Descriptors {
		if cfg != nil {
			matched[i] = cfg.Match(req.Domain, entries)
		}
		res.Statuses[i] = Status{Code: CodeOK, Rule: matched[i]}
	}
	active := rules.Active(matched, nil)
	var (
		op    algo.Op
		ref   opRef
		found int
	)
	for d, r := range matched {
		if r == nil || r.Unlimited {
			continue
		}
		for j := range r.Limits {
			if active[d]&(1<<uint(j)) == 0 {
				continue
			}
			found++
			lim := &r.Limits[j]
			if lim.Scope != rules.Local || r.ShadowMode {
				return op, ref, res, fmt.Errorf("%w (%s is %s scope)", ErrNotShapeable, r.ID, lim.Scope)
			}
			key := l.keys.intern(r.AppendKey(nil, req.Descriptors[d], j))
			ref = opRef{desc: d, limit: lim, key: key}
			op = algo.Op{Key: key, Algorithm: lim.Algorithm, Limit: lim.Algo(), N: n}
		}
	}
	if found != 1 {
		return op, ref, res, fmt.Errorf("%w (%d limits in force)", ErrNotShapeable, found)
	}
	return op, ref, res, nil
}
