package sitestore

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/streamlimit/streamlimit/enforcer/algo"
	"github.com/streamlimit/streamlimit/internal/testenv"
)

// TestOverLimitCache: once Redis has refused a hit of a counter, requests of a hit on it
// are refused in process until the refusal's retry time, without a call, with the
// Decision Redis reports (a peek in Redis at the same instant); a request with another
// counter too, a larger request, one under another limit, or one at the retry time asks
// Redis again, and is admitted when Redis admits it. The cache never admits anything.
func TestOverLimitCache(t *testing.T) {
	reg := prometheus.NewRegistry()
	s := newStore(t, testenv.RedisClient(t), testenv.KeyPrefix(t), func(c *Config) { c.Registerer = reg })
	ctx := context.Background()
	for _, alg := range []algo.Algorithm{algo.SlidingWindow, algo.FixedWindow, algo.SlidingLog, algo.TokenBucket, algo.GCRA} {
		lim := algo.Limit{Requests: 4, Window: time.Minute}
		hot := algo.Op{Key: "d|user=mallory#" + alg.String(), Algorithm: alg, Limit: lim, N: 1}
		other := algo.Op{Key: "d|path=/x#" + alg.String(), Algorithm: alg, Limit: algo.Limit{Requests: 100, Window: time.Minute}, N: 1}
		out := make([]algo.Decision, 2)
		calls := func() float64 { return value(t, s.m.calls.WithLabelValues("ok")) }
		cached := func() float64 { return value(t, s.m.overLimit) }
		now := t0
		for i := range 4 {
			if ok, _ := s.AllowAll(ctx, now, []algo.Op{hot}, out); !ok {
				t.Fatalf("%v: hit %d under a limit of 4 refused", alg, i+1)
			}
		}
		if ok, _ := s.AllowAll(ctx, now, []algo.Op{hot}, out); ok {
			t.Fatalf("%v: a 5th hit under a limit of 4 admitted", alg)
		}
		retry := out[0].RetryAfter
		c0, k0 := calls(), cached()
		later := now.Add(retry / 2)
		for range 50 {
			if ok, fb := s.AllowAll(ctx, later, []algo.Op{hot}, out[:1]); ok || fb {
				t.Fatalf("%v: cached refusal: allowed %v fellBack %v", alg, ok, fb)
			}
		}
		if got := calls() - c0; got != 0 {
			t.Fatalf("%v: %v Redis calls for hits of a counter known to be over its limit, want 0", alg, got)
		}
		if v := cached() - k0; v != 50 {
			t.Fatalf("%v: over_limit_cached_total grew by %v, want 50", alg, v)
		}
		if p, _ := s.Peek(ctx, later, hot); out[0] != p {
			t.Fatalf("%v: cached refusal %+v; Redis says %+v", alg, out[0], p)
		}
		// Another counter in the request, a larger request, a raised limit: Redis's.
		c1 := calls()
		if ok, _ := s.AllowAll(ctx, later, []algo.Op{hot, other}, out); ok || calls() == c1 {
			t.Fatalf("%v: a request with a counter not in the cache was not sent to Redis (allowed %v)", alg, ok)
		}
		two := hot
		two.N = 2
		c2 := calls()
		if s.AllowAll(ctx, later, []algo.Op{two}, out); calls() == c2 {
			t.Fatalf("%v: a request of 2 hits was refused by the cache", alg)
		}
		raised := hot
		raised.Limit.Requests = 10
		if ok, _ := s.AllowAll(ctx, later, []algo.Op{raised}, out); !ok {
			t.Fatalf("%v: a hit under a raised limit was refused by the cache of the old one", alg)
		}
		// At the retry time Redis decides again.
		c3 := calls()
		s.AllowAll(ctx, now.Add(retry), []algo.Op{hot}, out)
		if calls() == c3 {
			t.Fatalf("%v: the cache refused at the retry time", alg)
		}
	}
}
