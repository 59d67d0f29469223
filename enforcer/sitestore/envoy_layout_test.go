package sitestore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/streamlimit/streamlimit/internal/breaker"
	"github.com/streamlimit/streamlimit/internal/testenv"
)

// IncrEnvoy keeps envoyproxy/ratelimit's layout: a plain integer at the key as given (no
// prefix, no hash tag), added to by each call, 0 included, and expiring a whole number of
// seconds (at least one) after the last call.
func TestIncrEnvoy(t *testing.T) {
	client := testenv.RedisClient(t)
	s := newStore(t, client, testenv.KeyPrefix(t), nil)
	ctx := context.Background()
	key := testenv.KeyPrefix(t) + "d_user_42_1767225600"
	other := key + "x"
	out := make([]int64, 2)
	for i, n := range []int64{3, 0, 4} {
		if err := s.IncrEnvoy(ctx, []EnvoyIncr{{Key: key, N: n, Expire: time.Hour}, {Key: other, N: 1, Expire: 1500 * time.Millisecond}}, out); err != nil {
			t.Fatal(err)
		}
		if want := []int64{[]int64{3, 3, 7}[i], int64(i + 1)}; out[0] != want[0] || out[1] != want[1] {
			t.Fatalf("call %d: counts %v, want %v", i+1, out, want)
		}
	}
	if v, err := client.Get(ctx, key).Int64(); err != nil || v != 7 {
		t.Fatalf("GET %s: %d, %v; want 7, the key as given", key, v, err)
	}
	if ttl := client.TTL(ctx, key).Val(); ttl <= 59*time.Minute || ttl > time.Hour {
		t.Errorf("TTL %v, want an hour", ttl)
	}
	if ttl := client.TTL(ctx, other).Val(); ttl != time.Second {
		t.Errorf("TTL of a 1.5 s expiry %v, want whole seconds (1 s)", ttl)
	}
}

// An open breaker keeps IncrEnvoy from Redis: it says so, and the caller decides in
// process.
func TestIncrEnvoyBreakerOpen(t *testing.T) {
	s := newStore(t, testenv.RedisClient(t), testenv.KeyPrefix(t), func(c *Config) {
		c.Breaker = breaker.Options{MinFailures: 1, ErrorRate: 0.01, ProbeInterval: time.Hour}
	})
	for s.BreakerState() != breaker.Open {
		s.breaker.Failure()
	}
	err := s.IncrEnvoy(context.Background(), []EnvoyIncr{{Key: testenv.KeyPrefix(t) + "k", N: 1, Expire: time.Second}}, make([]int64, 1))
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("err %v, want ErrUnavailable", err)
	}
}
