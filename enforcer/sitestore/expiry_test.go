package sitestore

import (
	"context"
	"testing"
	"time"

	"github.com/streamlimit/streamlimit/enforcer/algo"
	"github.com/streamlimit/streamlimit/internal/testenv"
)

// TestWindowKeyExpiresWithItsWindow: a window counter's expiry is set when the counter
// moves to a window, not on every hit (script.lua, store). On Redis's real clock, with 1 s
// windows: the first hit of a window sets the key to expire at the window's end (fixed
// window) or the next one's (sliding window, which weighs the previous window), plus the
// slack; a later hit in the same window leaves that instant as it was; the first hit of the
// next window moves it a window later (without it, the key would expire under a live
// count); and the key is gone once that instant passes.
func TestWindowKeyExpiresWithItsWindow(t *testing.T) {
	const slack = 300 * time.Millisecond
	client := testenv.RedisClient(t)
	s := newStore(t, client, testenv.KeyPrefix(t), func(c *Config) { c.ExpirySlack = slack })
	for _, alg := range []algo.Algorithm{algo.FixedWindow, algo.SlidingWindow} {
		t.Run(alg.String(), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			op := algo.Op{Key: "d|expiry#" + alg.String(), Algorithm: alg, Limit: algo.Limit{Requests: 100, Window: time.Second}, N: 1}
			key := s.redisKey(op.Key)
			out := make([]algo.Decision, 1)
			windows := time.Duration(1) // the windows a counter outlives its window start by
			if alg == algo.SlidingWindow {
				windows = 2
			}
			// hit decides op now and returns the instant its key expires at, by Redis's
			// clock as this process reads it (PTTL added to the time it was read).
			hit := func() time.Time {
				t.Helper()
				if ok, fb := s.AllowAll(ctx, time.Now(), []algo.Op{op}, out); !ok || fb {
					t.Fatalf("allowed %v fellBack %v", ok, fb)
				}
				ttl, err := client.PTTL(ctx, key).Result()
				if err != nil || ttl <= 0 {
					t.Fatalf("PTTL = %v, %v; want a positive TTL", ttl, err)
				}
				return time.Now().Add(ttl)
			}
			// within checks that the key expires at want, no earlier (1 ms of rounding) and
			// no later than a slow call on a loaded machine can make it.
			within := func(what string, got, want time.Time) {
				t.Helper()
				if got.Before(want.Add(-2*time.Millisecond)) || got.After(want.Add(250*time.Millisecond)) {
					t.Fatalf("%s: the key expires at %v, want %v (the window's end plus the slack)", what, got.Format(time.StampMilli), want.Format(time.StampMilli))
				}
			}
			start := time.Now().Truncate(time.Second).Add(time.Second) // the next window boundary
			time.Sleep(time.Until(start.Add(20 * time.Millisecond)))
			end := start.Add(windows * time.Second).Add(slack)
			within("first hit of a window", hit(), end)
			time.Sleep(300 * time.Millisecond)
			within("second hit of the window", hit(), end)
			time.Sleep(time.Until(start.Add(time.Second + 50*time.Millisecond)))
			end = end.Add(time.Second)
			within("first hit of the next window", hit(), end)
			time.Sleep(time.Until(end.Add(300 * time.Millisecond)))
			if n, err := client.Exists(ctx, key).Result(); err != nil || n != 0 {
				t.Fatalf("EXISTS after the window's end and the slack = %v, %v; want 0", n, err)
			}
		})
	}
}
