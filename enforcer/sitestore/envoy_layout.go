package sitestore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
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
// decides in process (AllowAll's fallback). Counts kept this way are not part of the
// outage write back (outage.go): a Redis that lost its data starts them at 0, as it does
// for envoyproxy/ratelimit.
func (s *Store) IncrEnvoy(ctx context.Context, incrs []EnvoyIncr, out []int64) error {
	out = out[:len(incrs)]
	if len(incrs) == 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	ok, _ := s.breaker.Allow()
	if !ok {
		return ErrUnavailable
	}
	cctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	start := time.Now()
	cmds := make([]*redis.IntCmd, len(incrs))
	_, err := s.client.Pipelined(cctx, func(p redis.Pipeliner) error {
		for i, in := range incrs {
			cmds[i] = p.IncrBy(cctx, in.Key, in.N)
			p.Expire(cctx, in.Key, max(in.Expire.Truncate(time.Second), time.Second))
		}
		return nil
	})
	s.m.duration.Observe(time.Since(start).Seconds())
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
