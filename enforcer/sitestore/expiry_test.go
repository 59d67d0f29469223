package sitestore

import (
	"context"
	"maps"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/streamlimit/streamlimit/enforcer/algo"
	"github.com/streamlimit/streamlimit/internal/testenv"
)

// TestWindowKeyExpiresWithItsWindow: a window counter's expiry is set when the counter
// moves to a window, not on every hit (script.lua, store). On Redis's real clock, with 1 s
// windows: the first hit of a window sets the key to expire at the window's end (fixed
// window) or the next one's (sliding window, which weighs the previous window), plus the
// slack; a later hit in the same window leaves that instant as it was; the first hit of the
// next window moves it a window later (without it, the key would expire under a live
// count); and the key is gone once that instant passes. The sub-bucket sliding window has
// its own test (TestSubBucketKeyExpiry).
func TestWindowKeyExpiresWithItsWindow(t *testing.T) {
	const slack = 300 * time.Millisecond
	client := testenv.RedisClient(t)
	s := newStore(t, client, testenv.KeyPrefix(t), func(c *Config) { c.ExpirySlack = slack })
	for _, alg := range []algo.Algorithm{algo.FixedWindow, algo.SlidingWindowEstimate} {
		t.Run(alg.String(), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			op := algo.Op{Key: "d|expiry#" + alg.String(), Algorithm: alg, Limit: algo.Limit{Requests: 100, Window: time.Second}, N: 1}
			key := s.redisKey(op.Key)
			out := make([]algo.Decision, 1)
			windows := time.Duration(1) // the windows a counter outlives its window start by
			if alg == algo.SlidingWindowEstimate {
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

// TestSubBucketKeyExpiry: a sub-bucket sliding window's key expires when its newest
// sub-bucket with hits has left the window, plus the slack (on Redis's real clock, 1 s
// windows of 17 ms sub-buckets): a hit in the same sub-bucket leaves the expiry as it was,
// a hit in a later one moves it, and the key is gone once it passes.
func TestSubBucketKeyExpiry(t *testing.T) {
	const slack = 300 * time.Millisecond
	client := testenv.RedisClient(t)
	s := newStore(t, client, testenv.KeyPrefix(t), func(c *Config) { c.ExpirySlack = slack })
	ctx := context.Background()
	op := algo.Op{Key: "d|expiry#subbuckets", Algorithm: algo.SlidingWindow, Limit: algo.Limit{Requests: 100, Window: time.Second}, N: 1}
	g := algo.SubBucketsOf(op.Limit.Window)
	key := s.redisKey(op.Key)
	out := make([]algo.Decision, 1)
	// hit decides op at now and checks that the key expires when want's sub-bucket
	// leaves the window, plus the slack (no earlier than 2 ms of rounding, no later than a
	// slow call on a loaded machine can make it).
	hit := func(what string, now, want time.Time) time.Time {
		t.Helper()
		if ok, fb := s.AllowAll(ctx, now, []algo.Op{op}, out); !ok || fb {
			t.Fatalf("%s: allowed %v fellBack %v", what, ok, fb)
		}
		ttl, err := client.PTTL(ctx, key).Result()
		if err != nil || ttl <= 0 {
			t.Fatalf("%s: PTTL = %v, %v; want a positive TTL", what, ttl, err)
		}
		got := time.Now().Add(ttl)
		end := time.Unix(0, g.Leaves(g.Bucket(want.UnixNano()))).Add(slack)
		if got.Before(end.Add(-2*time.Millisecond)) || got.After(end.Add(250*time.Millisecond)) {
			t.Fatalf("%s: the key expires at %v, want %v", what, got.Format(time.StampMilli), end.Format(time.StampMilli))
		}
		return end
	}
	first := time.Now()
	hit("first hit", first, first)
	// The same sub-bucket, stamped a little later: the expiry stays.
	hit("a hit in the same sub-bucket", time.Unix(0, g.Bucket(first.UnixNano())*g.Width), first)
	time.Sleep(3 * time.Duration(g.Width))
	now := time.Now()
	end := hit("a hit in a later sub-bucket", now, now)
	time.Sleep(time.Until(end.Add(300 * time.Millisecond)))
	if n, err := client.Exists(ctx, key).Result(); err != nil || n != 0 {
		t.Fatalf("EXISTS after the newest sub-bucket has left the window and the slack = %v, %v; want 0", n, err)
	}
}

// TestCommandsPerHit holds the commands a hit of one op costs Redis, on a Redis of its own
// (INFO commandstats counts every client's): a window counter's hit within its window reads
// the hash and writes its count (HMGET, HSET: no PEXPIRE, its expiry is the window's), the
// first hit of the next window sets the expiry too, and the bucket family sets it on every
// hit (its expiry moves with each).
func TestCommandsPerHit(t *testing.T) {
	p := startPrivateRedis(t)
	client := redis.NewClient(&redis.Options{Addr: p.Addr()})
	t.Cleanup(func() { _ = client.Close() })
	s := newStore(t, client, "cmds:", nil)
	ctx := context.Background()
	counts := func() map[string]int64 {
		t.Helper()
		m := map[string]int64{}
		infoSum(t, client, "commandstats", func(name, value string) string {
			cmd, ok := strings.CutPrefix(name, "cmdstat_")
			if !ok {
				return ""
			}
			for _, f := range strings.Split(value, ",") {
				if v, ok := strings.CutPrefix(f, "calls="); ok {
					n, err := strconv.ParseInt(v, 10, 64)
					if err != nil {
						t.Fatal(err)
					}
					m[cmd] = n
				}
			}
			return ""
		})
		return m
	}
	start := time.Unix(t0.Unix()/60*60, 0).Add(time.Second) // a second into a minute window
	for _, tc := range []struct {
		alg       algo.Algorithm
		perHit    map[string]int64 // the commands of a hit within the window
		newWindow map[string]int64 // of the first hit of the next one
	}{
		{algo.SlidingWindow, map[string]int64{"hmget": 1, "hset": 1}, map[string]int64{"hmget": 1, "hset": 1, "pexpire": 1}},
		{algo.SlidingWindowEstimate, map[string]int64{"hmget": 1, "hset": 1}, map[string]int64{"hmget": 1, "hset": 1, "pexpire": 1}},
		{algo.FixedWindow, map[string]int64{"hmget": 1, "hset": 1}, map[string]int64{"hmget": 1, "hset": 1, "pexpire": 1}},
		{algo.TokenBucket, map[string]int64{"hmget": 1, "hset": 1, "pexpire": 1}, map[string]int64{"hmget": 1, "hset": 1, "pexpire": 1}},
		{algo.GCRA, map[string]int64{"hmget": 1, "hset": 1, "pexpire": 1}, map[string]int64{"hmget": 1, "hset": 1, "pexpire": 1}},
	} {
		op := algo.Op{Key: "d|cmds#" + tc.alg.String(), Algorithm: tc.alg, Limit: algo.Limit{Requests: 1000, Window: time.Minute}, N: 1}
		out := make([]algo.Decision, 1)
		hits := func(at time.Time, n int) map[string]int64 {
			t.Helper()
			before := counts()
			for i := range n {
				if ok, fb := s.AllowAll(ctx, at.Add(time.Duration(i)*time.Millisecond), []algo.Op{op}, out); !ok || fb {
					t.Fatalf("%v: allowed %v fellBack %v", tc.alg, ok, fb)
				}
			}
			d := map[string]int64{}
			for cmd, c := range counts() {
				// Not counted: the test's own INFO, the script calls holding the commands,
				// and SET, the Store's own key it renews once a minute (outage.go).
				if c -= before[cmd]; c != 0 && cmd != "info" && cmd != "evalsha" && cmd != "eval" && cmd != "script|load" && cmd != "set" {
					d[cmd] = c
				}
			}
			return d
		}
		hits(start, 1) // a new counter
		const n = 10
		want := map[string]int64{}
		for cmd, c := range tc.perHit {
			want[cmd] = n * c
		}
		if got := hits(start.Add(time.Millisecond), n); !maps.Equal(got, want) { // the sub-bucket sliding window's 1 s sub-bucket too
			t.Errorf("%v: %d hits within the window sent %v, want %v", tc.alg, n, got, want)
		}
		if got := hits(start.Add(time.Minute), 1); !maps.Equal(got, tc.newWindow) {
			t.Errorf("%v: the first hit of the next window sent %v, want %v", tc.alg, got, tc.newWindow)
		}
	}
}
