package sitestore

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/streamlimit/streamlimit/enforcer/algo"
	"github.com/streamlimit/streamlimit/enforcer/sitecount"
)

// deadRedis returns a client for a loopback port where nothing listens, so that every call
// fails at once and the fallback decides.
func deadRedis(t *testing.T) redis.UniversalClient {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestFallbackShare: with Redis down, each of a site's N enforcers counts only itself, so
// each keeps to 1/N of every limit and together they stay within it.
func TestFallbackShare(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, deadRedis(t), "fs:", func(c *Config) { c.FallbackShare = 0.5 })
	op := algo.Op{Key: "api|user=1#60s", Algorithm: algo.FixedWindow, Limit: algo.Limit{Requests: 10, Window: time.Minute}, N: 1}
	var out [1]algo.Decision
	admitted := 0
	for range 20 {
		ok, fellBack := s.AllowAll(ctx, t0, []algo.Op{op}, out[:])
		if !fellBack {
			t.Fatal("Redis is down but the decision did not fall back")
		}
		if ok {
			admitted++
		}
	}
	if admitted != 5 {
		t.Fatalf("site limit 10 with FallbackShare 0.5: admitted %d in fallback, want 5", admitted)
	}

	c := NewCounter(s, CounterOptions{FallbackShare: 0.5})
	gop := []sitecount.Op{{Key: "api|user=1#60s", Window: time.Minute, N: 1, Cap: 10}}
	admitted = 0
	for range 20 {
		if ok, err := c.Commit(ctx, t0, gop, nil); err != nil {
			t.Fatal(err)
		} else if ok {
			admitted++
		}
	}
	if admitted != 5 {
		t.Fatalf("global cap 10 with FallbackShare 0.5: committed %d in fallback, want 5", admitted)
	}
}
