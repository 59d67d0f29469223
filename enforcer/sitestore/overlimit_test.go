package sitestore

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/streamlimit/streamlimit/enforcer/algo"
	"github.com/streamlimit/streamlimit/internal/testenv"
)

// TestOverLimitCache: once Redis has refused a counter, its requests are refused in
// process until the refusal's retry time, with Redis's answer, and without a call; a
// smaller request, one under another limit, or one at the retry time asks Redis again,
// and is admitted when Redis admits it. The cache never admits anything.
func TestOverLimitCache(t *testing.T) {
	reg := prometheus.NewRegistry()
	s := newStore(t, testenv.RedisClient(t), testenv.KeyPrefix(t), func(c *Config) { c.Registerer = reg })
	ctx := context.Background()
	lim := algo.Limit{Requests: 4, Window: time.Minute}
	hot := algo.Op{Key: "d|user=mallory#1m", Algorithm: algo.SlidingWindow, Limit: lim, N: 2}
	other := algo.Op{Key: "d|path=/x#1m", Algorithm: algo.SlidingWindow, Limit: algo.Limit{Requests: 100, Window: time.Minute}, N: 1}
	out := make([]algo.Decision, 2)
	calls := func() float64 { return value(t, s.m.calls.WithLabelValues("ok")) }
	now := t0
	for i := range 2 {
		if ok, _ := s.AllowAll(ctx, now, []algo.Op{hot}, out); !ok {
			t.Fatalf("request %d of 2 hits under a limit of 4 refused", i+1)
		}
	}
	if ok, _ := s.AllowAll(ctx, now, []algo.Op{hot}, out); ok {
		t.Fatal("a 5th and 6th hit under a limit of 4 admitted")
	}
	redisSaid := out[0]
	before := calls()
	later := now.Add(10 * time.Second)
	for range 50 {
		ok, fb := s.AllowAll(ctx, later, []algo.Op{hot, other}, out)
		if ok || fb {
			t.Fatalf("cached refusal: allowed %v fellBack %v", ok, fb)
		}
	}
	if got := calls() - before; got != 0 {
		t.Fatalf("%v Redis calls for requests of a counter known to be over its limit, want 0", got)
	}
	if v := value(t, s.m.overLimit); v != 50 {
		t.Fatalf("over_limit_cached_total = %v, want 50", v)
	}
	if out[0].Allowed || out[0].RetryAfter != redisSaid.RetryAfter-10*time.Second || out[0].Limit != redisSaid.Limit {
		t.Fatalf("cached refusal %+v; want Redis's %+v, 10 s on", out[0], redisSaid)
	}
	if !out[1].Allowed || out[1].Limit != 100 {
		t.Fatalf("the request's other counter: %+v; want reported as fitting on its own", out[1])
	}
	if v, _ := s.Peek(ctx, later, other); v.Remaining != 100 {
		t.Fatalf("a refused request took from its other counter: remaining %d", v.Remaining)
	}
	// A smaller request, and one under a raised limit, are Redis's to decide.
	one := hot
	one.N = 1
	if _, fb := s.AllowAll(ctx, later, []algo.Op{one}, out); fb || calls() == before {
		t.Fatal("a request of 1 after a refusal of 2 was not sent to Redis")
	}
	raised := hot
	raised.Limit.Requests = 10
	if ok, _ := s.AllowAll(ctx, later, []algo.Op{raised}, out); !ok {
		t.Fatal("a request under a raised limit was refused by the cache of the old one")
	}
	// At the retry time Redis decides again (the window still holds the 6 hits: refused,
	// by Redis, and cached again).
	c := calls()
	s.AllowAll(ctx, now.Add(redisSaid.RetryAfter), []algo.Op{hot}, out)
	if calls() == c {
		t.Fatal("the cache refused past the retry time")
	}
}
