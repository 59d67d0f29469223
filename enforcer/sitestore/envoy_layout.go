package sitestore

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/streamlimit/streamlimit/enforcer/algo"
)

// EnvoyIncr is one counter in envoyproxy/ratelimit's own Redis layout: a plain integer at
// Key (its whole Redis key: no KeyPrefix, no hash tag is added), which each hit adds to
// with INCRBY and whose expiry each call sets again with EXPIRE. A deployment of
// envoyproxy/ratelimit and enforcers that count its fixed windows so share their counts on
// one Redis, and either can replace the other without starting the windows afresh
// (docs/envoy-compat.md).
type EnvoyIncr struct {
	// Key is the Redis key, as envoyproxy/ratelimit builds it.
	Key string
	// N is added to the count; 0 reads it (creating the key at 0, as INCRBY 0 does).
	N int64
	// Expire is the key's expiry, set after the increment, in whole seconds (at least 1).
	Expire time.Duration
}

// ErrUnavailable is IncrEnvoy's error when the circuit breaker keeps calls from Redis.
var ErrUnavailable = errors.New("sitestore: redis unavailable (circuit breaker open)")

// IncrEnvoy adds each incr's N to its key and sets its expiry, in one pipeline of INCRBY
// and EXPIRE pairs, as envoyproxy/ratelimit does (not atomic across keys, as there: its
// keys carry no hash tag, and on a Cluster they span slots), and writes the counts after
// the increments to out (len(out) must be ≥ len(incrs)). The call goes through the Store's
// timeout and circuit breaker; on an error nothing is known of the counts, and the caller
// decides in process with FallbackEnvoy, whose hits are written back to these keys once
// Redis answers again. A Redis that lost its data starts them at 0, as it does for
// envoyproxy/ratelimit.
func (s *Store) IncrEnvoy(ctx context.Context, incrs []EnvoyIncr, out []int64) error {
	out = out[:len(incrs)]
	if len(incrs) == 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	ok, probe := s.breaker.Allow()
	if !ok {
		return ErrUnavailable
	}
	var err error
	if wb := probe || s.pend.n.Load() > 0; wb || s.fails.Load() != s.checked.Load() {
		// As in run: hits admitted in process (FallbackEnvoy's among them) go to Redis
		// before it counts anything again.
		err = s.recover(ctx, s.clk.Now(), probe)
		if errors.Is(err, errWriteBackBusy) {
			if wb {
				s.breaker.Cancel()
				s.m.calls.WithLabelValues(reasonWritingBack).Inc()
				return err
			}
			err = nil
		}
	}
	cmds := make([]*redis.IntCmd, len(incrs))
	if err == nil {
		cctx, cancel := context.WithTimeout(ctx, s.timeout)
		start := time.Now()
		_, err = s.client.Pipelined(cctx, func(p redis.Pipeliner) error {
			for i, in := range incrs {
				cmds[i] = p.IncrBy(cctx, in.Key, in.N)
				p.Expire(cctx, in.Key, max(in.Expire.Truncate(time.Second), time.Second))
			}
			return nil
		})
		s.m.duration.Observe(time.Since(start).Seconds())
		cancel()
	}
	if err != nil {
		if ctx.Err() != nil {
			s.m.calls.WithLabelValues(reasonCanceled).Inc()
			s.breaker.Cancel()
			return ctx.Err()
		}
		result := "error"
		if isTimeout(err) {
			result = "timeout"
		}
		s.m.calls.WithLabelValues(result).Inc()
		s.m.errors.Inc()
		s.fails.Add(1)
		s.breaker.Failure()
		return fmt.Errorf("sitestore: envoy counters: %w", err)
	}
	s.breaker.Success()
	s.m.calls.WithLabelValues("ok").Inc()
	for i, c := range cmds {
		out[i] = c.Val()
	}
	return nil
}

// CountEnvoy adds each incr's N to its counter in envoyproxy/ratelimit's layout and
// writes the counts after to out (len(out) ≥ len(incrs)): in Redis (IncrEnvoy), or, when
// Redis cannot be reached, in process (FallbackEnvoy, then fellBack). It is the one place
// where such a counter is counted, whichever of the enforcer's APIs a client asks.
func (s *Store) CountEnvoy(ctx context.Context, now time.Time, incrs []EnvoyIncr, out []int64) (fellBack bool) {
	if len(incrs) == 0 {
		return false
	}
	if err := s.IncrEnvoy(ctx, incrs, out); err != nil {
		s.FallbackEnvoy(now, incrs, out)
		return true
	}
	return false
}

// envoyFallbackPrefix keeps FallbackEnvoy's counters apart from AllowAll's in the
// fallback store.
const envoyFallbackPrefix = "envoy\x00"

// FallbackEnvoy counts incrs in process, for when IncrEnvoy failed: each adds its N to a
// fixed window of its Expire aligned on the Unix epoch (the window its key names), and out
// gets the count after it divided by FallbackShare (len(out) must be ≥ len(incrs)), so
// that a caller that compares it with the limit admits this process's share of the limit.
// The hits are kept to be written back to their keys with INCRBY when Redis answers again
// (outage.go), unless their window has ended by then.
func (s *Store) FallbackEnvoy(now time.Time, incrs []EnvoyIncr, out []int64) {
	t := now.UnixNano()
	var d [1]algo.Decision
	for i, in := range incrs {
		w := max(in.Expire.Truncate(time.Second), time.Second)
		op := algo.Op{Key: envoyFallbackPrefix + in.Key, Algorithm: algo.FixedWindow,
			Limit: algo.Limit{Requests: math.MaxInt64 / 4, Window: w}, N: in.N}
		s.fallback.AllowAll(now, []algo.Op{op}, d[:])
		out[i] = int64(math.Ceil(float64(d[0].Limit-d[0].Remaining) / s.fallbackShare))
		if in.N <= 0 {
			continue
		}
		end := (t/int64(w) + 1) * int64(w)
		s.pend.add("e"+in.Key, t, func() *writeBack {
			return &writeBack{envoy: true, op: algo.Op{Key: in.Key}, window: w, end: end}
		}, in.N)
	}
}

// writeBackEnvoy adds a batch of FallbackEnvoy's hits to its key, unless its window has
// ended. Unlike the other write backs it carries no marker: the key has no hash tag to put
// one in its slot, so a write back retried after a timeout that hid its success counts
// its hits twice (more, never less, than were admitted).
func (s *Store) writeBackEnvoy(ctx context.Context, now time.Time, wb *writeBack) error {
	if now.UnixNano() >= wb.end {
		return nil
	}
	cctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	_, err := s.client.Pipelined(cctx, func(p redis.Pipeliner) error {
		p.IncrBy(cctx, wb.op.Key, wb.op.N)
		p.Expire(cctx, wb.op.Key, wb.window)
		return nil
	})
	if err != nil {
		return fmt.Errorf("sitestore: writing back %d hits of %q: %w", wb.op.N, wb.op.Key, err)
	}
	return nil
}
