package enforcer

import (
	"context"
	"errors"
	"time"

	"github.com/streamlimit/streamlimit/enforcer/algo"
)

// ErrQueueFull is returned by Await when Config.MaxWaiters requests are already waiting:
// the request was decided once and denied, without waiting.
var ErrQueueFull = errors.New("enforcer: too many requests waiting")

// Await is Decide that waits instead of refusing, for limits of every scope: when the
// request is denied and its Retry-After is within maxDelay (further bounded by ctx's
// deadline), it waits that long and decides again, until it is admitted, its next wait
// would go past maxDelay, or ctx is done (the client went away). For a global limit the
// wait is for room at this site's cap: other sites' traffic may move it, so the decision
// is made again rather than a slot reserved. While waiting the request holds one of
// Config.MaxWaiters places; when they are all taken it is not queued (ErrQueueFull, with
// the denial). Quota is taken only by the decision that admits.
//
// It writes the last decision to res and returns how long it waited. A request denied
// for good returns no error; ctx's error is returned when ctx ended the wait.
func (l *Engine) Await(ctx context.Context, req Request, maxDelay time.Duration, res *Result) (waited time.Duration, err error) {
	start := l.cfg.Clock.Now()
	if dl, ok := ctx.Deadline(); ok {
		maxDelay = min(maxDelay, dl.Sub(start))
	}
	queued := false
	defer func() {
		if queued {
			l.waiters.Add(-1)
			l.metrics.waiting.Dec()
			l.metrics.waited.Observe(waited.Seconds())
		}
	}()
	for {
		now := l.cfg.Clock.Now()
		waited = now.Sub(start)
		l.DecideAt(ctx, now, req, res)
		if res.Code == CodeOK {
			if queued {
				l.metrics.awaited.WithLabelValues("admitted").Inc()
			}
			return waited, nil
		}
		retry := res.retryAfter()
		if retry <= 0 || retry == algo.Never || waited+retry > maxDelay {
			if queued {
				l.metrics.awaited.WithLabelValues("gave_up").Inc()
			}
			return waited, nil
		}
		if !queued {
			if l.waiters.Add(1) > int64(l.cfg.MaxWaiters) {
				l.waiters.Add(-1)
				l.metrics.awaited.WithLabelValues("queue_full").Inc()
				return waited, ErrQueueFull
			}
			queued = true
			l.metrics.waiting.Inc()
		}
		if err := l.cfg.Sleep(ctx, retry); err != nil {
			l.metrics.awaited.WithLabelValues("canceled").Inc()
			return l.cfg.Clock.Now().Sub(start), err
		}
	}
}

// retryAfter is the longest Retry-After of the descriptors that denied.
func (r *Result) retryAfter() time.Duration {
	var d time.Duration
	for i := range r.Statuses {
		if st := &r.Statuses[i]; st.Code == CodeOverLimit {
			d = max(d, st.RetryAfter)
		}
	}
	return d
}
