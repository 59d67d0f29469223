package sitestore

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/streamlimit/streamlimit/enforcer/sitestore/breaker"
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

// FallbackEnvoy counts in process on this process's share, and the write back adds the
// hits to the keys in envoyproxy/ratelimit's layout with INCRBY (on what others counted
// there meanwhile), and leaves out a window that ended before Redis came back.
func TestFallbackEnvoyWritesBack(t *testing.T) {
	client := testenv.RedisClient(t)
	s := newStore(t, client, testenv.KeyPrefix(t), func(c *Config) { c.FallbackShare = 0.5 })
	ctx := context.Background()
	now := time.Unix(1767225600+30, 0) // 30 s into an hour and into a minute
	hour := testenv.KeyPrefix(t) + "d_user_42_1767225600"
	minute := testenv.KeyPrefix(t) + "d_ip_1_1767225600"
	out := make([]int64, 2)
	for range 3 {
		s.FallbackEnvoy(now, []EnvoyIncr{{Key: hour, N: 2, Expire: time.Hour}, {Key: minute, N: 1, Expire: time.Minute}}, out)
	}
	if out[0] != 12 || out[1] != 6 {
		t.Fatalf("counts %v, want 6 and 3 hits over a share of 0.5: [12 6]", out)
	}
	if n := s.Pending(); n != 2 {
		t.Fatalf("%d batches pending, want 2", n)
	}
	if err := client.Set(ctx, hour, 5, 0).Err(); err != nil { // counted by another meanwhile
		t.Fatal(err)
	}
	// Back 40 s later: the hour's window is on, the minute's ended.
	if err := s.flush(ctx, now.Add(40*time.Second)); err != nil {
		t.Fatal(err)
	}
	if v, err := client.Get(ctx, hour).Int64(); err != nil || v != 11 {
		t.Errorf("GET %s: %d, %v; want 5 + 6 written back", hour, v, err)
	}
	if ttl := client.TTL(ctx, hour).Val(); ttl <= 59*time.Minute {
		t.Errorf("TTL %v, want the unit's", ttl)
	}
	if n, _ := client.Exists(ctx, minute).Result(); n != 0 {
		t.Errorf("%s written back after its window ended", minute)
	}
	if n := s.Pending(); n != 0 {
		t.Errorf("%d batches pending after the write back, want 0", n)
	}
}

// IncrEnvoy, the first call to reach Redis after FallbackEnvoy counted in process, writes
// those hits back first, so that a deployment that counts only in envoyproxy/ratelimit's
// layout writes them back too.
func TestIncrEnvoyWritesBackFirst(t *testing.T) {
	client := testenv.RedisClient(t)
	s := newStore(t, client, testenv.KeyPrefix(t), nil)
	ctx := context.Background()
	now := time.Now()
	key := testenv.KeyPrefix(t) + "d_user_42_" + strconv.FormatInt(now.Unix()/86400*86400, 10)
	out := make([]int64, 1)
	s.FallbackEnvoy(now, []EnvoyIncr{{Key: key, N: 4, Expire: 24 * time.Hour}}, out)
	if err := s.IncrEnvoy(ctx, []EnvoyIncr{{Key: key, N: 1, Expire: 24 * time.Hour}}, out); err != nil {
		t.Fatal(err)
	}
	if out[0] != 5 || s.Pending() != 0 {
		t.Fatalf("count %d with %d batches pending; want 4 written back + 1, none", out[0], s.Pending())
	}
}
