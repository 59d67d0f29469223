package httplimit

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/streamlimit/streamlimit/enforcer"
)

// MaxDelay is the longest wait a check request may ask for with max_delay_ms: a client
// that would wait longer should rather be told when to come back.
const MaxDelay = time.Minute

// Awaiter decides a request, waiting up to maxDelay for room instead of refusing it when
// its limits say room will come by then; *enforcer.Engine is one (see its Await: the
// waiters are bounded, a wait ends when ctx does, quota is taken only when admitted). It
// writes the last decision to res and returns how long it waited.
type Awaiter interface {
	Await(ctx context.Context, req enforcer.Request, maxDelay time.Duration, res *enforcer.Result) (time.Duration, error)
}

// Delay returns a Decider that waits up to maxDelay for room before it refuses: given to
// New, it makes the middleware, the reverse proxy (NewProxy) and the nginx endpoint hold
// a request that its limits will admit within maxDelay, and pass it on then, instead of
// answering 429 at once. A request that would wait longer, or finds the waiting places
// full, or whose client goes away, gets the denial as before.
func Delay(aw Awaiter, maxDelay time.Duration) Decider {
	return delayDecider{aw: aw, max: maxDelay}
}

type delayDecider struct {
	aw  Awaiter
	max time.Duration
}

// DecideInto waits as Await does. Await's error (queue full, client gone) needs no
// handling here: res holds the denial, which the caller answers.
func (d delayDecider) DecideInto(ctx context.Context, req enforcer.Request, res *enforcer.Result) {
	_, _ = d.aw.Await(ctx, req, d.max, res)
}

// checkDelay returns the wait a check request allows (its max_delay_ms), 0 when absent.
func checkDelay(ms *int64) (time.Duration, error) {
	if ms == nil {
		return 0, nil
	}
	if *ms < 0 || *ms > MaxDelay.Milliseconds() {
		return 0, &checkError{fmt.Sprintf("max_delay_ms: %d is not in 0..%d", *ms, MaxDelay.Milliseconds())}
	}
	return time.Duration(*ms) * time.Millisecond, nil
}

// decideCheck decides a check request: at once, or, when it allows a wait and dec can
// wait (an Awaiter), waiting up to maxDelay for room. It returns how long it waited.
func decideCheck(ctx context.Context, dec Decider, req enforcer.Request, maxDelay time.Duration, res *enforcer.Result) time.Duration {
	if aw, ok := dec.(Awaiter); ok && maxDelay > 0 {
		waited, _ := aw.Await(ctx, req, maxDelay, res)
		return waited
	}
	dec.DecideInto(ctx, req, res)
	return 0
}

// decideGroups decides req, whose descriptors cost s.costs, into s.res as the gRPC service
// decides such a request: the descriptors of each cost together, in order of first
// appearance, stopping at the first group denied (the groups admitted before it keep what
// they took, as there). Each group may wait for room up to what is left of maxDelay. It
// returns the time waited.
func (s *checkState) decideGroups(ctx context.Context, dec Decider, req enforcer.Request, maxDelay time.Duration) time.Duration {
	res := &s.res
	res.Code = enforcer.CodeOK
	res.Statuses = res.Statuses[:0]
	for range s.costs {
		res.Statuses = append(res.Statuses, enforcer.Status{Code: enforcer.CodeOK})
	}
	var waited time.Duration
	for i, h := range s.costs {
		if res.Code == enforcer.CodeOverLimit || slices.Contains(s.costs[:i], h) {
			continue
		}
		s.gdescs, s.gidx = s.gdescs[:0], s.gidx[:0]
		for j := i; j < len(s.costs); j++ {
			if s.costs[j] == h {
				s.gidx = append(s.gidx, j)
				s.gdescs = append(s.gdescs, req.Descriptors[j])
			}
		}
		waited += decideCheck(ctx, dec, enforcer.Request{Domain: req.Domain, Descriptors: s.gdescs, Hits: h}, maxDelay-waited, &s.group)
		for k, j := range s.gidx {
			res.Statuses[j] = s.group.Statuses[k]
		}
		if s.group.Code == enforcer.CodeOverLimit {
			res.Code = enforcer.CodeOverLimit
		}
	}
	return waited
}
