package sitestore

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/streamlimit/streamlimit/clock"
	"github.com/streamlimit/streamlimit/enforcer/sitecount"
	"github.com/streamlimit/streamlimit/enforcer/sitestore/breaker"
	"github.com/streamlimit/streamlimit/internal/testenv"
	"github.com/streamlimit/streamlimit/window"
)

func near(a, b float64) bool {
	if a == b {
		return true
	}
	return math.Abs(a-b) <= 1e-9*math.Max(1, math.Abs(b))
}

// TestCounterMatchesLocalCounter drives the Redis Counter and sitecount.Local with the
// same random sequence of Counts and Commits, on a fake clock, and requires the same counts
// and the same Commit answers at every step.
func TestCounterMatchesLocalCounter(t *testing.T) {
	client := testenv.RedisClient(t)
	for _, sub := range []int{60, 7} {
		t.Run("sub="+strconv.Itoa(sub), func(t *testing.T) {
			// The slack keeps Redis's real-time TTLs out of this fake-time comparison.
			s := newStore(t, client, testenv.KeyPrefix(t), func(c *Config) { c.ExpirySlack = time.Hour })
			rc := NewCounter(s, CounterOptions{SubBuckets: sub})
			// The Redis counter interpolates the oldest sub-bucket, as the aggregator does.
			lc := sitecount.NewLocal(sitecount.LocalOptions{SubBuckets: sub, Interpolate: true})
			rng := rand.New(rand.NewPCG(uint64(sub), 7))
			clk := clock.NewFake(t0)
			ctx := context.Background()
			keys := []string{"g|k=a#1s", "g|k=b#10s", "g|k=c#1m", "h|k=d#1.5s"}
			windows := []time.Duration{time.Second, 10 * time.Second, time.Minute, 1500 * time.Millisecond}
			// Rarely, a key is used with another window (the rules changed): its ring restarts.
			// 700µs is under a millisecond: such a ring never matches and restarts every time.
			otherWindows := []time.Duration{3 * time.Second, 700 * time.Microsecond}
			var allOps []sitecount.Op
			for i := range keys {
				for _, w := range append([]time.Duration{windows[i]}, otherWindows...) {
					allOps = append(allOps, sitecount.Op{Key: keys[i], Window: w})
				}
			}
			gotAll := make([]float64, len(allOps))
			wantAll := make([]float64, len(allOps))
			// commitBoth commits ops to both counters and compares the answers and the
			// counts reported; want holds LocalCounter's Counts before the commit.
			commitBoth := func(step int, now time.Time, ops []sitecount.Op, want []float64) bool {
				t.Helper()
				nops := len(ops)
				got := make([]float64, nops)
				lcounts := make([]float64, nops)
				for i := range lcounts {
					lcounts[i] = math.NaN() // LocalCounter stops filling at the first op that does not fit
				}
				ok, err := rc.Commit(ctx, now, ops, got)
				if err != nil {
					t.Fatal(err)
				}
				wok, _ := lc.Commit(ctx, now, ops, lcounts)
				if ok != wok {
					t.Fatalf("step %d at %v: Commit %+v = %v, LocalCounter %v (counts %v)", step, now.Sub(t0), ops, ok, wok, want)
				}
				for i := range ops {
					if !near(got[i], want[i]) || (!math.IsNaN(lcounts[i]) && !near(got[i], lcounts[i])) {
						t.Fatalf("step %d at %v: Commit counts %v, LocalCounter %v / %v", step, now.Sub(t0), got, want, lcounts)
					}
				}
				return ok
			}
			countBoth := func(step int, now time.Time) {
				t.Helper()
				if err := rc.Counts(ctx, now, allOps, gotAll); err != nil {
					t.Fatal(err)
				}
				_ = lc.Counts(ctx, now, allOps, wantAll)
				for i := range allOps {
					if !near(gotAll[i], wantAll[i]) {
						t.Fatalf("step %d at %v: Counts %+v = %v, LocalCounter %v", step, now.Sub(t0), allOps[i], gotAll[i], wantAll[i])
					}
				}
			}
			// First, one key with two windows in one request, in both orders: LocalCounter
			// restarts the ring for the new window, and an op checked on the replaced ring
			// counts nowhere.
			inf := math.Inf(1)
			a1 := sitecount.Op{Key: keys[0], Window: windows[0], N: 1, Cap: inf}
			a3 := sitecount.Op{Key: keys[0], Window: otherWindows[0], N: 2, Cap: inf}
			for i, ops := range [][]sitecount.Op{{a1}, {a3, a1}, {a1}, {a1, a3}, {a3, a1, a3}, {a1}} {
				want := make([]float64, len(ops))
				_ = lc.Counts(ctx, t0, ops, want)
				commitBoth(-1-i, t0, ops, want)
				countBoth(-1-i, t0)
			}
			allowed, denied := 0, 0
			for step := 0; step < 1500; step++ {
				switch r := rng.IntN(20); {
				case r < 8:
					clk.Advance(time.Duration(rng.IntN(40)) * time.Millisecond)
				case r < 16:
					clk.Advance(time.Duration(rng.IntN(1200)) * time.Millisecond)
				case r < 18:
					clk.Advance(time.Duration(rng.Int64N(int64(90 * time.Second))))
				case r < 19:
					// Back in time a little (a caller's clock stepped back): adds then go to
					// older buckets of the ring, or nowhere.
					clk.Advance(-time.Duration(rng.IntN(3000)) * time.Millisecond)
				default:
					clk.Advance(time.Duration(rng.Int64N(int64(5 * time.Hour))))
				}
				now := clk.Now()

				nops := 1 + rng.IntN(3)
				ops := make([]sitecount.Op, nops)
				want := make([]float64, nops)
				for i := range ops {
					k := rng.IntN(len(keys))
					w := windows[k]
					if rng.IntN(60) == 0 {
						w = otherWindows[rng.IntN(len(otherWindows))]
					}
					ops[i] = sitecount.Op{Key: keys[k], Window: w, N: int64(rng.IntN(4))}
				}
				if err := lc.Counts(ctx, now, ops, want); err != nil {
					t.Fatal(err)
				}
				for i := range ops {
					switch r := rng.IntN(40); {
					case r == 0:
						ops[i].Cap = math.Inf(1)
					case r == 1:
						ops[i].Cap = math.NaN()
					case r == 2:
						ops[i].Cap = math.Inf(-1)
					case r == 3 && ops[i].Window == windows[0]:
						ops[i].N = 1<<32 + 5 // saturates the bucket
						ops[i].Cap = math.Inf(1)
					default:
						ops[i].Cap = math.Floor(want[i]) + float64(rng.IntN(8)) - 2 + float64(rng.IntN(4))/4
					}
				}

				if rng.IntN(4) == 0 {
					countBoth(step, now)
				}

				ok := commitBoth(step, now, ops, want)
				if ok {
					allowed++
				} else {
					denied++
				}
			}
			if allowed < 200 || denied < 200 {
				t.Fatalf("%d commits allowed, %d denied: the sequence does not exercise both outcomes", allowed, denied)
			}
			if v := value(t, s.m.counterFB.WithLabelValues("commit", "error")); v != 0 {
				t.Fatalf("%v commits fell back", v)
			}
		})
	}
}

func TestCounterTwoEnforcersShareCount(t *testing.T) {
	prefix := testenv.KeyPrefix(t)
	a := NewCounter(newStore(t, testenv.RedisClient(t), prefix, nil), CounterOptions{})
	b := NewCounter(newStore(t, testenv.RedisClient(t), prefix, nil), CounterOptions{})
	ctx := context.Background()
	op := sitecount.Op{Key: "g|shared#1m", Window: time.Minute, N: 1, Cap: 50}
	done := make(chan int)
	for _, c := range []*Counter{a, b} {
		go func() {
			n := 0
			for i := 0; i < 40; i++ {
				// Each enforcer's clock: a few ms apart, inside one bucket.
				if ok, err := c.Commit(ctx, t0.Add(time.Duration(i%3)*time.Millisecond), []sitecount.Op{op}, nil); ok && err == nil {
					n++
				}
			}
			done <- n
		}()
	}
	if admitted := <-done + <-done; admitted != 50 {
		t.Fatalf("two enforcers admitted %d of 80 against a shared cap of 50", admitted)
	}
	out := make([]float64, 1)
	for name, c := range map[string]*Counter{"a": a, "b": b} {
		if err := c.Counts(ctx, t0.Add(time.Second), []sitecount.Op{op}, out); err != nil || out[0] != 50 {
			t.Fatalf("enforcer %s counts %v, %v; want exactly 50", name, out[0], err)
		}
		if v := value(t, c.s.m.calls.WithLabelValues("ok")); v < 1 {
			t.Fatalf("enforcer %s made no Redis calls", name)
		}
	}
	// Once t0's bucket has slid out of the window, the count is zero for both.
	if err := a.Counts(ctx, t0.Add(time.Minute+2*time.Second), []sitecount.Op{op}, out); err != nil || out[0] != 0 {
		t.Fatalf("count after the window passed = %v, %v; want 0", out[0], err)
	}
}

func TestCounterAllOrNothing(t *testing.T) {
	client := testenv.RedisClient(t)
	prefix := testenv.KeyPrefix(t)
	c := NewCounter(newStore(t, client, prefix, nil), CounterOptions{})
	ctx := context.Background()
	ops := []sitecount.Op{
		{Key: "api|user=1#60s", Window: time.Minute, N: 1, Cap: 10},
		{Key: "api|ip=x#60s", Window: time.Minute, N: 1, Cap: 1},
	}
	if ok, err := c.Commit(ctx, t0, ops, nil); !ok || err != nil {
		t.Fatalf("first commit: %v, %v", ok, err)
	}
	counts := make([]float64, 2)
	for i := 0; i < 3; i++ {
		if ok, err := c.Commit(ctx, t0, ops, counts); ok || err != nil {
			t.Fatalf("commit %d past a cap of 1: %v, %v", i+2, ok, err)
		}
		if counts[0] != 1 || counts[1] != 1 {
			t.Fatalf("counts reported by a denied commit: %v, want [1 1]", counts)
		}
	}
	k := c.RedisKey(ops[0].Key)
	if k != prefix+"g{api}api|user=1#60s" {
		t.Fatalf("redis key %q", k)
	}
	bucket := strconv.FormatInt(t0.UnixMilli()/1000, 10) // 1m / 60 sub-buckets = 1 s buckets
	h, err := client.HGetAll(ctx, k).Result()
	if err != nil || h[bucket] != "1" || h["w"] != "60000" || h["h"] != bucket || len(h) != 3 {
		t.Fatalf("hash of the first key = %v, %v; want only bucket %s = 1 (denied commits took nothing)", h, err, bucket)
	}
	// Ops of one request on one key add up before the check.
	same := []sitecount.Op{
		{Key: "api|same#1m", Window: time.Minute, N: 2, Cap: 3},
		{Key: "api|same#1m", Window: time.Minute, N: 2, Cap: 3},
	}
	if ok, _ := c.Commit(ctx, t0, same, nil); ok {
		t.Fatal("two ops of 2 on one key fit under a cap of 3")
	}
	same[0].Cap, same[1].Cap = 4, 4
	if ok, _ := c.Commit(ctx, t0, same, nil); !ok {
		t.Fatal("two ops of 2 on one key did not fit under a cap of 4")
	}
	out := make([]float64, 1)
	if _ = c.Counts(ctx, t0, same[:1], out); out[0] != 4 {
		t.Fatalf("count %v, want 4", out[0])
	}
}

func TestCounterTTLAndTrim(t *testing.T) {
	client := testenv.RedisClient(t)
	s := newStore(t, client, testenv.KeyPrefix(t), nil) // ExpirySlack 1 s
	c := NewCounter(s, CounterOptions{})
	ctx := context.Background()
	op := sitecount.Op{Key: "g|ttl#1m", Window: time.Minute, N: 1, Cap: math.Inf(1)}
	spec := window.NewSpec(time.Minute, 60, 0)
	k := c.RedisKey(op.Key)
	now := t0
	var set time.Time // when the last commit set the TTL, by the wall clock Redis counts it on
	for i := 0; i < 200; i++ {
		set = time.Now()
		if ok, _ := c.Commit(ctx, now, []sitecount.Op{op}, nil); !ok {
			t.Fatal("commit under an infinite cap denied")
		}
		now = now.Add(700 * time.Millisecond)
	}
	// window + bucket width + slack = 60 + 1 + 1 s, less what has passed since it was set.
	if ttl, err := client.PTTL(ctx, k).Result(); err != nil || ttl <= 61*time.Second-time.Since(set) || ttl > 62*time.Second {
		t.Fatalf("PTTL = %v, %v; want in (61s, 62s] less the %v since it was set", ttl, err, time.Since(set))
	}
	h, err := client.HGetAll(ctx, k).Result()
	if err != nil {
		t.Fatal(err)
	}
	head, _ := strconv.ParseInt(h["h"], 10, 64)
	if head != spec.Bucket(now.Add(-700*time.Millisecond).UnixMilli()) {
		t.Fatalf("head %d", head)
	}
	for f := range h {
		if f == "w" || f == "h" {
			continue
		}
		if i, err := strconv.ParseInt(f, 10, 64); err != nil || i <= head-int64(spec.Slots) || i > head {
			t.Fatalf("field %q outside the ring (%d, %d]", f, head-int64(spec.Slots), head)
		}
	}
	if len(h) > spec.Slots+2 {
		t.Fatalf("%d fields, ring has %d slots", len(h), spec.Slots)
	}
}

func TestCounterRedisDownFallbackAndRecovery(t *testing.T) {
	rd := startPrivateRedis(t)
	bclk := clock.NewFake(time.Unix(0, 0))
	reg := prometheus.NewRegistry()
	s := newStore(t, failFastClient(t, rd.Addr()), "sl:", func(c *Config) {
		c.Clock = bclk
		c.Registerer = reg
		c.Breaker = breaker.Options{MinFailures: 2, ProbeInterval: time.Second, ProbeSuccesses: 1}
	})
	c := NewCounter(s, CounterOptions{})
	ctx := context.Background()
	op := []sitecount.Op{{Key: "d|u=1#1m", Window: time.Minute, N: 1, Cap: 3}}
	counts := make([]float64, 1)
	if ok, err := c.Commit(ctx, t0, op, counts); !ok || err != nil || counts[0] != 0 {
		t.Fatalf("with Redis up: %v, %v, count %v", ok, err, counts[0])
	}

	rd.Kill()
	// Redis is down: the in-process counter answers, no error, starting from the last
	// count Redis reported (1: the first commit).
	for i := 0; i < 2; i++ {
		ok, fb, err := c.CommitReport(ctx, t0, op, counts)
		if !ok || !fb || err != nil || counts[0] != float64(i+1) {
			t.Fatalf("Redis down, commit %d: %v (fell back %v), %v, count %v; want the in-process count %d", i, ok, fb, err, counts[0], i+1)
		}
	}
	if got := s.BreakerState(); got != breaker.Open {
		t.Fatalf("breaker %v after Redis went down, want open", got)
	}
	if ok, err := c.Commit(ctx, t0, op, counts); ok || err != nil {
		t.Fatalf("fallback let a 4th hit through a cap of 3 (%v): it counted from zero", err)
	}
	if err := c.Counts(ctx, t0, op, counts); err != nil || counts[0] != 3 {
		t.Fatalf("Counts with Redis down = %v, %v; want the fallback's 3", counts[0], err)
	}
	fb := func(op, reason string) float64 { return value(t, s.m.counterFB.WithLabelValues(op, reason)) }
	if fb("commit", "error")+fb("commit", "timeout") != 2 || fb("commit", "breaker_open") != 1 || fb("counts", "breaker_open") != 1 {
		t.Fatalf("counter_fallback_total: commit error %v timeout %v breaker_open %v, counts breaker_open %v",
			fb("commit", "error"), fb("commit", "timeout"), fb("commit", "breaker_open"), fb("counts", "breaker_open"))
	}

	rd.Restart() // with its data lost
	if _, err := c.Commit(ctx, t0, op, counts); err != nil || counts[0] != 3 {
		t.Fatalf("a call went to Redis while the breaker was open (count %v, %v)", counts[0], err)
	}
	bclk.Advance(time.Second)
	// The probe finds that Redis lost its data, restores the last known count (1), writes
	// back the 2 hits committed in process, then decides in Redis: the cap is reached.
	if ok, fb, err := c.CommitReport(ctx, t0, op, counts); ok || fb || err != nil || counts[0] != 3 {
		t.Fatalf("probe: %v (fell back %v), %v, count %v; want a Redis refusal on the 3 restored and written back", ok, fb, err, counts[0])
	}
	if got := s.BreakerState(); got != breaker.Closed {
		t.Fatalf("breaker %v after a successful probe, want closed", got)
	}
	if err := c.Counts(ctx, t0, op, counts); err != nil || counts[0] != 3 {
		t.Fatalf("Counts after recovery = %v, %v; want Redis's 3", counts[0], err)
	}
}

func benchmarkCommit(b *testing.B, nops int) {
	client := testenv.RedisClient(b)
	c := NewCounter(newStore(b, client, testenv.KeyPrefix(b), nil), CounterOptions{})
	ops := make([]sitecount.Op, nops)
	for i := range ops {
		ops[i] = sitecount.Op{Key: fmt.Sprintf("bench|k=%d#1m", i), Window: time.Minute, N: 1, Cap: 1e15}
	}
	counts := make([]float64, nops)
	ctx := context.Background()
	now := t0
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		now = now.Add(100 * time.Microsecond)
		if ok, err := c.Commit(ctx, now, ops, counts); !ok || err != nil {
			b.Fatalf("commit: %v, %v", ok, err)
		}
	}
	if v := value(b, c.s.m.counterFB.WithLabelValues("commit", "error")) + value(b, c.s.m.counterFB.WithLabelValues("commit", "timeout")); v != 0 {
		b.Fatalf("%v commits fell back", v)
	}
}

func BenchmarkCounterCommit1(b *testing.B) { benchmarkCommit(b, 1) }
func BenchmarkCounterCommit3(b *testing.B) { benchmarkCommit(b, 3) }

// TestCounterHard: an op with Hard counts the oldest sub-bucket whole, as LocalCounter
// does: once the cap is reached, nothing more is admitted until those hits have wholly left
// the window, where interpolation would already admit more.
func TestCounterHard(t *testing.T) {
	s := newStore(t, testenv.RedisClient(t), testenv.KeyPrefix(t), func(c *Config) { c.ExpirySlack = time.Hour })
	rc := NewCounter(s, CounterOptions{SubBuckets: 10})
	lc := sitecount.NewLocal(sitecount.LocalOptions{SubBuckets: 10, Interpolate: true})
	ctx := context.Background()
	start := time.UnixMilli(t0.UnixMilli() / 1000 * 1000) // a bucket boundary (100 ms buckets)
	for _, hard := range []bool{true, false} {
		op := sitecount.Op{Key: fmt.Sprintf("g|k=hard-%v#1s", hard), Window: time.Second, N: 20, Cap: 20, Hard: hard}
		for _, c := range []sitecount.Counter{rc, lc} {
			if ok, _ := c.Commit(ctx, start, []sitecount.Op{op}, nil); !ok {
				t.Fatalf("hard %v: the first 20 did not fit a cap of 20", hard)
			}
		}
		// Half of the first bucket has left the window: interpolation counts 10 of the 20.
		at := start.Add(time.Second + 50*time.Millisecond)
		one := op
		one.N = 1
		got := make([]float64, 1)
		want := make([]float64, 1)
		rok, _ := rc.Commit(ctx, at, []sitecount.Op{one}, got)
		lok, _ := lc.Commit(ctx, at, []sitecount.Op{one}, want)
		if rok != lok || got[0] != want[0] {
			t.Fatalf("hard %v: Redis Commit %v (count %v), LocalCounter %v (count %v)", hard, rok, got[0], lok, want[0])
		}
		if rok == hard {
			t.Fatalf("hard %v: a 21st hit 1.05 s after 20 was admitted %v, want %v", hard, rok, !hard)
		}
	}
}
