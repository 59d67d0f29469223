package sitestore

import (
	"context"
	"fmt"
	"math/big"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"

	"github.com/streamlimit/streamlimit/clock"
	"github.com/streamlimit/streamlimit/enforcer/algo"
	"github.com/streamlimit/streamlimit/enforcer/sitecount"
	"github.com/streamlimit/streamlimit/enforcer/sitestore/breaker"
	"github.com/streamlimit/streamlimit/internal/testenv"
)

// testTimeout is generous: the test machine has 2 cores and runs other packages at once.
const testTimeout = 2 * time.Second

func newStore(t testing.TB, client redis.UniversalClient, prefix string, mod func(*Config)) *Store {
	t.Helper()
	cfg := Config{Redis: Redis{Client: client, KeyPrefix: prefix, Timeout: testTimeout}}
	if mod != nil {
		mod(&cfg)
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

var t0 = time.Unix(1763740000, 123456789)

// testLimits returns a few limits for every algorithm, including ones whose emission
// interval is not a whole number of nanoseconds and one whose products pass 2^53 in Lua.
func testLimits() []algo.Limit {
	return []algo.Limit{
		{Requests: 5, Window: time.Second},
		{Requests: 7, Window: 3 * time.Second, Burst: 3, SoftPercent: 50},
		{Requests: 3, Window: 700 * time.Millisecond},
		{Requests: 1_000_003, Window: 30 * 24 * time.Hour, Burst: 1_500_000},
	}
}

func TestMatchesAlgoStore(t *testing.T) {
	client := testenv.RedisClient(t)
	for _, a := range algo.Algorithms() { // every algorithm, new ones included
		if _, ok := notInRedis[a]; ok {
			continue
		}
		t.Run(a.String(), func(t *testing.T) {
			rs := newStore(t, client, testenv.KeyPrefix(t), nil)
			ls := algo.New(algo.Options{})
			limits := testLimits()
			rng := rand.New(rand.NewPCG(uint64(a)+1, 42))
			now := t0
			keys := []string{"d|k=a#1s", "d|k=b#1s", "d|k=c#1s", "d|k=d#1s"}
			ctx := context.Background()
			var got, want [3]algo.Decision
			allowedCount := 0
			var lastRetry time.Duration
			for step := 0; step < 600; step++ {
				switch rng.IntN(4) {
				case 0:
					// Retry exactly at, or 1 ns before, the last denial's RetryAfter:
					// the boundaries where rounding errors would show.
					if lastRetry > 0 && lastRetry != algo.Never {
						now = now.Add(lastRetry - time.Duration(rng.IntN(2)))
					}
				case 1:
					now = now.Add(time.Duration(rng.Int64N(int64(50 * time.Millisecond))))
				case 2:
					now = now.Add(time.Duration(rng.Int64N(int64(900 * time.Millisecond))))
				default:
					switch rng.IntN(10) {
					case 0:
						now = now.Add(time.Duration(rng.Int64N(int64(40 * 24 * time.Hour))))
					case 1:
						if a != algo.SlidingWindow {
							break // the others' late requests are held by TestLateRequestsKeepTheWindow
						}
						// A late request: stamped before ones already decided (another
						// enforcer's clock, or a longer way to Redis).
						now = now.Add(-time.Duration(rng.Int64N(int64(30 * time.Millisecond))))
					}
				}
				nops := 1 + rng.IntN(3)
				ops := make([]algo.Op, nops)
				for i := range ops {
					ki := rng.IntN(len(keys))
					lim := limits[ki%len(limits)]
					n := int64(rng.IntN(3))
					if lim.Requests > 1000 {
						n = rng.Int64N(600_000)
					}
					if rng.IntN(30) == 0 {
						n = lim.Burst + lim.Requests*2 // never fits
					}
					ops[i] = algo.Op{Key: keys[ki], Algorithm: a, Limit: lim, N: n}
				}
				if rng.IntN(8) == 0 {
					d, fb := rs.Peek(ctx, now, ops[0])
					if fb {
						t.Fatalf("step %d: Peek fell back", step)
					}
					if w := ls.Peek(now, ops[0]); d != w {
						t.Fatalf("step %d: Peek %+v\n redis %+v\n algo  %+v", step, ops[0], d, w)
					}
					continue
				}
				ok, fb := rs.AllowAll(ctx, now, ops, got[:])
				if fb {
					t.Fatalf("step %d: AllowAll fell back", step)
				}
				wok := ls.AllowAll(now, ops, want[:])
				if ok != wok {
					t.Fatalf("step %d at %v: allowed %v, algo %v for %+v", step, now.Sub(t0), ok, wok, ops)
				}
				if ok {
					allowedCount++
				}
				lastRetry = 0
				for i := range ops {
					if !want[i].Allowed {
						lastRetry = max(lastRetry, want[i].RetryAfter)
					}
					if got[i] != want[i] {
						t.Fatalf("step %d at %v: op %d of %+v\n redis %+v\n algo  %+v", step, now.Sub(t0), i, ops, got[i], want[i])
					}
				}
			}
			if allowedCount < 60 || allowedCount > 540 {
				t.Fatalf("%d of 600 requests allowed: the sequence does not exercise both outcomes", allowedCount)
			}
		})
	}
}

func TestAllOrNothingAndTTL(t *testing.T) {
	client := testenv.RedisClient(t)
	prefix := testenv.KeyPrefix(t)
	s := newStore(t, client, prefix, nil)
	ctx := context.Background()
	fw := algo.Limit{Requests: 10, Window: time.Minute}
	tight := algo.Limit{Requests: 1, Window: time.Minute}
	ops := []algo.Op{
		{Key: "api|user=1#60s", Algorithm: algo.FixedWindow, Limit: fw, N: 1},
		{Key: "api|ip=x#60s", Algorithm: algo.TokenBucket, Limit: tight, N: 1},
	}
	out := make([]algo.Decision, 2)
	if ok, _ := s.AllowAll(ctx, t0, ops, out); !ok {
		t.Fatalf("first request denied: %+v", out)
	}
	// The second limit is now exhausted: the request is denied, and the first limit
	// must not have been charged.
	for i := 0; i < 3; i++ {
		if ok, _ := s.AllowAll(ctx, t0, ops, out); ok {
			t.Fatalf("request %d allowed past the 1/min limit", i+2)
		}
		if !out[0].Allowed || out[0].Remaining != 9 {
			t.Fatalf("denied request charged the first limit: %+v", out[0])
		}
		if out[1].Allowed || out[1].RetryAfter != time.Minute {
			t.Fatalf("second limit decision %+v, want denied with retry 1m", out[1])
		}
	}
	k1 := prefix + "{api}api|user=1#60s"
	if cur, err := client.HGet(ctx, k1, "cur").Result(); err != nil || cur != "1" {
		t.Fatalf("stored count of the first limit = %q, %v; want 1", cur, err)
	}
	// TTLs: fixed window at t0 (123 ms into a minute window ... ) lasts until the window
	// ends, plus 1 s of slack; the bucket until it has refilled (1 min), plus slack.
	for _, c := range []struct {
		key string
		max time.Duration
	}{{k1, time.Minute + time.Second}, {prefix + "{api}api|ip=x#60s", time.Minute + time.Second}} {
		ttl, err := client.PTTL(ctx, c.key).Result()
		if err != nil || ttl <= time.Second || ttl > c.max {
			t.Fatalf("PTTL %s = %v, %v; want in (1s, %v]", c.key, ttl, err, c.max)
		}
	}
	// A sliding-log key and its list both expire.
	logOp := algo.Op{Key: "api|log#60s", Algorithm: algo.SlidingLog, Limit: fw, N: 2}
	if ok, _ := s.AllowAll(ctx, t0, []algo.Op{logOp}, out); !ok {
		t.Fatal("log op denied")
	}
	lk := prefix + "{api}api|log#60s:log"
	if n, _ := client.LLen(ctx, lk).Result(); n != 1 {
		t.Fatalf("log length %d, want 1 (one entry for the admission time)", n)
	}
	if e, want := client.LIndex(ctx, lk, 0).Val(), strconv.FormatInt(t0.UnixNano(), 10)+":2"; e != want {
		t.Fatalf("log entry %q, want %q", e, want)
	}
	if ttl, _ := client.PTTL(ctx, lk).Result(); ttl <= 0 || ttl > time.Minute+time.Second {
		t.Fatalf("log PTTL %v", ttl)
	}
}

func TestNoScriptReload(t *testing.T) {
	client := testenv.RedisClient(t)
	s := newStore(t, client, testenv.KeyPrefix(t), nil)
	ctx := context.Background()
	op := algo.Op{Key: "d|k#1s", Algorithm: algo.GCRA, Limit: algo.Limit{Requests: 2, Window: time.Second}, N: 1}
	out := make([]algo.Decision, 1)
	if ok, fb := s.AllowAll(ctx, t0, []algo.Op{op}, out); !ok || fb {
		t.Fatalf("first call: allowed %v fellBack %v", ok, fb)
	}
	if err := client.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if ex, _ := client.ScriptExists(ctx, s.script.Hash()).Result(); len(ex) != 1 || ex[0] {
		t.Fatalf("script still cached after SCRIPT FLUSH: %v", ex)
	}
	ok, fb := s.AllowAll(ctx, t0, []algo.Op{op}, out)
	if !ok || fb || out[0].Remaining != 0 {
		t.Fatalf("after SCRIPT FLUSH: allowed %v fellBack %v %+v; want the second of 2 admitted in Redis", ok, fb, out[0])
	}
	if ok, fb := s.AllowAll(ctx, t0, []algo.Op{op}, out); ok || fb {
		t.Fatalf("third call: allowed %v fellBack %v; want denied in Redis", ok, fb)
	}
}

func TestTwoEnforcersShareCount(t *testing.T) {
	prefix := testenv.KeyPrefix(t)
	a := newStore(t, testenv.RedisClient(t), prefix, nil)
	b := newStore(t, testenv.RedisClient(t), prefix, nil)
	ctx := context.Background()
	for _, alg := range []algo.Algorithm{algo.SlidingWindow, algo.TokenBucket, algo.SlidingLog} {
		op := algo.Op{Key: "d|shared#1m|" + alg.String(), Algorithm: alg, Limit: algo.Limit{Requests: 50, Window: time.Minute}, N: 1}
		admitted := 0
		done := make(chan int)
		for _, s := range []*Store{a, b} {
			go func() {
				n := 0
				out := make([]algo.Decision, 1)
				for i := 0; i < 40; i++ {
					if ok, fb := s.AllowAll(ctx, t0, []algo.Op{op}, out); ok && !fb {
						n++
					}
				}
				done <- n
			}()
		}
		admitted = <-done + <-done
		if admitted != 50 {
			t.Fatalf("%v: two enforcers admitted %d of 80 requests against a shared limit of 50", alg, admitted)
		}
	}
}

// startPrivateRedis runs a redis-server of the test's own, which it can kill, pause and
// restart; extra are more redis-server arguments.
func startPrivateRedis(t *testing.T, extra ...string) *testenv.RedisServer {
	t.Helper()
	return testenv.StartRedisServer(t, testenv.RedisServerOptions{
		Args: func(int, string) []string { return extra },
	})
}

// failFastClient returns a client of the Redis at addr that tries each call once, within
// the caller's deadline: a test that kills Redis sees the call fail, and the Store fall
// back, at once rather than after the client's retries.
func failFastClient(t *testing.T, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// pausableRedis starts a redis-server of the test's own and returns a client of it, for a
// test that pauses Redis (CLIENT PAUSE): paused, the suite's shared Redis would stall
// every other package's tests that run meanwhile.
func pausableRedis(t *testing.T) *redis.Client {
	t.Helper()
	rd := startPrivateRedis(t)
	c := redis.NewClient(&redis.Options{Addr: rd.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func TestRedisDownFallbackAndRecovery(t *testing.T) {
	rd := startPrivateRedis(t)
	bclk := clock.NewFake(time.Unix(0, 0))
	reg := prometheus.NewRegistry()
	client := failFastClient(t, rd.Addr())
	s := newStore(t, client, "sl:", func(c *Config) {
		c.Clock = bclk
		c.Registerer = reg
		c.Breaker = breaker.Options{MinFailures: 2, ProbeInterval: time.Second, ProbeSuccesses: 1}
	})
	ctx := context.Background()
	op := algo.Op{Key: "d|u=1#1m", Algorithm: algo.FixedWindow, Limit: algo.Limit{Requests: 3, Window: time.Minute}, N: 1}
	out := make([]algo.Decision, 1)
	if ok, fb := s.AllowAll(ctx, t0, []algo.Op{op}, out); !ok || fb {
		t.Fatalf("with Redis up: allowed %v fellBack %v", ok, fb)
	}

	rd.Kill()
	// Redis is down: decisions come from the in-process store, without error, starting
	// from the last count Redis reported (1 of 3), and after MinFailures failures the
	// breaker opens.
	for i := 0; i < 2; i++ {
		ok, fb := s.AllowAll(ctx, t0, []algo.Op{op}, out)
		if !fb || !ok || out[0].Remaining != int64(1-i) {
			t.Fatalf("Redis down, request %d: allowed %v fellBack %v %+v; want an in-process decision on the last known count", i, ok, fb, out[0])
		}
	}
	if ok, fb := s.AllowAll(ctx, t0, []algo.Op{op}, out); ok || !fb {
		t.Fatalf("fallback let a 4th request through a limit of 3 (fellBack %v): it counted from zero", fb)
	}
	if got := s.BreakerState(); got != breaker.Open {
		t.Fatalf("breaker %v after Redis went down, want open", got)
	}
	if v := value(t, s.m.fallback.WithLabelValues("breaker_open")); v < 1 {
		t.Fatalf("fallback_decisions_total{reason=breaker_open} = %v", v)
	}
	if v := value(t, s.m.errors); v < 2 {
		t.Fatalf("errors_total = %v, want ≥ 2", v)
	}
	if v := value(t, s.m.breakerState); v != 1 {
		t.Fatalf("breaker_state gauge = %v, want 1", v)
	}
	if s.Pending() == 0 {
		t.Fatal("no write back pending for the 2 hits admitted in process")
	}

	rd.Restart() // with its data lost
	// Until the probe interval passes, the breaker keeps Redis out of the path.
	if _, fb := s.AllowAll(ctx, t0, []algo.Op{op}, out); !fb {
		t.Fatal("a call went to Redis while the breaker was open")
	}
	bclk.Advance(time.Second)
	// The probe finds that Redis lost its data: it restores the last known use (1), writes
	// back the 2 hits admitted in process, then decides in Redis: 3 of 3 are used.
	ok, fb := s.AllowAll(ctx, t0, []algo.Op{op}, out)
	if fb || ok || out[0].Remaining != 0 {
		t.Fatalf("probe: allowed %v fellBack %v %+v; want a Redis refusal after the restore and write back", ok, fb, out[0])
	}
	if got := s.BreakerState(); got != breaker.Closed {
		t.Fatalf("breaker %v after a successful probe, want closed", got)
	}
	if v := value(t, s.m.breakerState); v != 0 {
		t.Fatalf("breaker_state gauge = %v, want 0", v)
	}
	if s.Pending() != 0 || value(t, s.m.writtenBack) == 0 {
		t.Fatalf("after recovery: %d batches pending, %v written back", s.Pending(), value(t, s.m.writtenBack))
	}
	if ok, _ := s.AllowAll(ctx, t0, []algo.Op{op}, out); ok {
		t.Fatal("Redis admitted a 4th request after the write back")
	}
}

// TestWriteBackIsIdempotent: a write back retried with the same batch (its first attempt
// timed out after Redis had applied it) counts once, for both stores.
func TestWriteBackIsIdempotent(t *testing.T) {
	s := newStore(t, testenv.RedisClient(t), testenv.KeyPrefix(t), nil)
	c := NewCounter(s, CounterOptions{})
	ctx := context.Background()
	op := algo.Op{Key: "d|wb#1m", Algorithm: algo.SlidingWindow, Limit: algo.Limit{Requests: 10, Window: time.Minute}, N: 4}
	gop := sitecount.Op{Key: "d|wbg#1m", Window: time.Minute, N: 4}
	for _, wb := range []*writeBack{
		{id: "x1", op: op, last: t0.UnixNano(), window: time.Minute},
		{id: "x2", c: c, gop: gop, last: t0.UnixNano(), window: time.Minute},
	} {
		for range 2 {
			if err := s.writeBackOne(ctx, t0, wb); err != nil {
				t.Fatal(err)
			}
		}
	}
	op.N = 1
	d, fb := s.Peek(ctx, t0, op)
	if fb || d.Remaining != 6 {
		t.Fatalf("after writing back 4 hits twice: remaining %d (fellBack %v), want 6", d.Remaining, fb)
	}
	counts := make([]float64, 1)
	if err := c.Counts(ctx, t0, []sitecount.Op{gop}, counts); err != nil || counts[0] != 4 {
		t.Fatalf("site count after writing back 4 hits twice = %v, %v; want 4", counts[0], err)
	}
}

// TestWriteBackWaitedFor: with the breaker closed (a Redis that answers, after a call that
// timed out on a busy machine), the calls that arrive while another call writes the
// pending hits back wait for it and are then decided in Redis, instead of each being
// decided in process (writing_back): one slow call must not turn a crowd of concurrent
// callers into fallback decisions. The write back is held up by pausing Redis.
func TestWriteBackWaitedFor(t *testing.T) {
	reg := prometheus.NewRegistry()
	rd := pausableRedis(t)
	s := newStore(t, rd, "wait:", func(c *Config) { c.Registerer = reg })
	ctx := context.Background()
	op := algo.Op{Key: "d|wait#1m", Algorithm: algo.SlidingWindow, Limit: algo.Limit{Requests: 1000, Window: time.Minute}, N: 1}
	s.pendAll(t0, []algo.Op{op}) // one hit admitted in process, pending
	if err := rd.Do(ctx, "CLIENT", "PAUSE", "200").Err(); err != nil {
		t.Fatal(err)
	}
	first := make(chan bool)
	go func() {
		out := make([]algo.Decision, 1)
		_, fb := s.AllowAll(ctx, t0, []algo.Op{op}, out)
		first <- fb
	}()
	for s.recovering.Load() == nil { // the first call is writing back, held by the pause
		time.Sleep(time.Millisecond)
	}
	const callers = 16
	var fellBack atomic.Int64
	var wg sync.WaitGroup
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out := make([]algo.Decision, 1)
			if ok, fb := s.AllowAll(ctx, t0, []algo.Op{op}, out); fb || !ok {
				fellBack.Add(1)
			}
		}()
	}
	wg.Wait()
	if fb := <-first; fb {
		t.Error("the call writing back was decided in process")
	}
	if n := fellBack.Load(); n != 0 {
		t.Errorf("%d of %d calls arriving during the write back were decided in process or denied; want 0", n, callers)
	}
	if n := value(t, s.m.calls.WithLabelValues(reasonWritingBack)); n != 0 {
		t.Errorf("calls_total{result=writing_back} = %v, want 0", n)
	}
	// Redis holds the hit written back and every call's.
	d, fb := s.Peek(ctx, t0, op)
	if want := int64(1000 - 1 - 1 - callers); fb || d.Remaining != want {
		t.Fatalf("remaining %d (fellBack %v), want %d", d.Remaining, fb, want)
	}
}

func TestCheckLimit(t *testing.T) {
	if err := CheckLimit(algo.SlidingWindow, algo.Limit{Requests: 10, Window: 30 * 24 * time.Hour}); err != nil {
		t.Fatalf("30-day window rejected: %v", err)
	}
	if err := CheckLimit(algo.SlidingWindow, algo.Limit{Requests: 10, Window: 365 * 24 * time.Hour}); err == nil {
		t.Fatal("a 1-year sliding window was accepted")
	}
	// The fixed window's Lua counts time in milliseconds: a (calendar) year is in range.
	if err := CheckLimit(algo.FixedWindowOn(algo.Year), algo.Limit{Requests: 10, Window: 365 * 24 * time.Hour}); err != nil {
		t.Fatalf("a 1-year fixed window was rejected: %v", err)
	}
	// A sliding log's entries, not its allowance, bound its size.
	if err := CheckLimit(algo.SlidingLog, algo.Limit{Requests: 1 << 40, Window: time.Second}); err != nil {
		t.Fatalf("a sliding log of 2^40 was rejected: %v", err)
	}
	// Out of range at run time: decided in process, counted.
	s := newStore(t, testenv.RedisClient(t), testenv.KeyPrefix(t), nil)
	out := make([]algo.Decision, 1)
	op := algo.Op{Key: "d|y", Algorithm: algo.SlidingWindow, Limit: algo.Limit{Requests: 1, Window: 365 * 24 * time.Hour}, N: 1}
	if ok, fb := s.AllowAll(context.Background(), t0, []algo.Op{op}, out); !ok || !fb {
		t.Fatalf("out-of-range op: allowed %v fellBack %v", ok, fb)
	}
	if v := value(t, s.m.fallback.WithLabelValues("out_of_range")); v != 1 {
		t.Fatalf("fallback_decisions_total{reason=out_of_range} = %v", v)
	}
}

func benchmarkAllowAll(b *testing.B, nops int) {
	client := testenv.RedisClient(b)
	s := newStore(b, client, testenv.KeyPrefix(b), nil)
	ops := make([]algo.Op, nops)
	for i := range ops {
		ops[i] = algo.Op{Key: fmt.Sprintf("bench|k=%d#1s", i), Algorithm: algo.Algorithm(i % 6),
			Limit: algo.Limit{Requests: 1 << 40, Window: time.Second}, N: 1}
	}
	ops[0].Algorithm = algo.GCRA
	out := make([]algo.Decision, nops)
	ctx := context.Background()
	now := t0
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		now = now.Add(time.Microsecond)
		if ok, fb := s.AllowAll(ctx, now, ops, out); !ok || fb {
			b.Fatalf("allowed %v fellBack %v", ok, fb)
		}
	}
}

func BenchmarkAllowAll1(b *testing.B) { benchmarkAllowAll(b, 1) }
func BenchmarkAllowAll3(b *testing.B) { benchmarkAllowAll(b, 3) }

// value reads a counter or gauge.
func value(t testing.TB, m prometheus.Metric) float64 {
	t.Helper()
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		t.Fatal(err)
	}
	switch {
	case d.Counter != nil:
		return d.Counter.GetValue()
	case d.Gauge != nil:
		return d.Gauge.GetValue()
	}
	t.Fatal("not a counter or gauge")
	return 0
}

// TestSlidingWindowExactProducts puts the sliding window's estimate exactly on the boundary
// prev×x = (k+1)×w − 1 with products near 2^71, where doubles cannot tell the sides apart.
func TestSlidingWindowExactProducts(t *testing.T) {
	s := newStore(t, testenv.RedisClient(t), testenv.KeyPrefix(t), nil)
	ls := algo.New(algo.Options{})
	const a = 1_000_003 // prime
	w := int64(30*24*time.Hour) + 7
	lim := algo.Limit{Requests: a, Window: time.Duration(w)}
	// n ≡ 1 − w⁻¹ (mod a) makes (a−n+1)·w ≡ 1 (mod a), so x = ((a−n+1)·w − 1)/a is whole.
	inv := new(big.Int).ModInverse(big.NewInt(w), big.NewInt(a))
	n := new(big.Int).Mod(new(big.Int).Sub(big.NewInt(1), inv), big.NewInt(a)).Int64()
	if n < 2 {
		n += a
	}
	num := new(big.Int).Mul(big.NewInt(a-n+1), big.NewInt(w))
	num.Sub(num, big.NewInt(1))
	x := num.Div(num, big.NewInt(a)).Int64()

	ws := t0.UnixNano() / w * w
	ctx := context.Background()
	out := make([]algo.Decision, 1)
	fill := algo.Op{Key: "d|edge", Algorithm: algo.SlidingWindowEstimate, Limit: lim, N: a}
	if ok, fb := s.AllowAll(ctx, time.Unix(0, ws), []algo.Op{fill}, out); !ok || fb {
		t.Fatalf("filling the previous window: %v %v", ok, fb)
	}
	ls.Allow(time.Unix(0, ws), fill)
	op := algo.Op{Key: "d|edge", Algorithm: algo.SlidingWindowEstimate, Limit: lim, N: n}
	before := time.Unix(0, ws+w+(w-x)-1)
	d, _ := s.Peek(ctx, before, op)
	if want := ls.Peek(before, op); d != want || d.Allowed {
		t.Fatalf("1 ns before the boundary: redis %+v, algo %+v; want denied", d, want)
	}
	at := before.Add(1)
	ok, _ := s.AllowAll(ctx, at, []algo.Op{op}, out)
	want := ls.Allow(at, op)
	if !ok || out[0] != want {
		t.Fatalf("at the boundary: redis %v %+v, algo %+v; want allowed", ok, out[0], want)
	}
}

// TestFallbackChargesOwnAdmissions: two enforcers share a limit of 10 and fall back on
// halves when Redis goes. b last heard from Redis at a count of 1 (its own request); a
// then had Redis admit 5 more (a count of 6). Charged half of the counts they saw (1 and
// 3), the two would admit 4 + 2 in process, 12 in all; a charges itself the 5 it
// admitted instead, and the site keeps to 10.
func TestFallbackChargesOwnAdmissions(t *testing.T) {
	rd := startPrivateRedis(t)
	prefix := testenv.KeyPrefix(t)
	stores := make([]*Store, 2)
	for i := range stores {
		stores[i] = newStore(t, failFastClient(t, rd.Addr()), prefix, func(c *Config) { c.FallbackShare = 0.5 })
	}
	a, b := stores[0], stores[1]
	ctx := context.Background()
	op := algo.Op{Key: "d|u=own#1m", Algorithm: algo.SlidingWindow, Limit: algo.Limit{Requests: 10, Window: time.Minute}, N: 1}
	out := make([]algo.Decision, 1)
	allow := func(s *Store, n int, wantFellBack bool) (admitted int) {
		t.Helper()
		for range n {
			ok, fb := s.AllowAll(ctx, t0, []algo.Op{op}, out)
			if fb != wantFellBack {
				t.Fatalf("fellBack %v, want %v", fb, wantFellBack)
			}
			if ok {
				admitted++
			}
		}
		return admitted
	}
	inRedis := allow(b, 1, false) + allow(a, 5, false)
	rd.Kill()
	byA, byB := allow(a, 10, true), allow(b, 10, true)
	t.Logf("admitted in Redis %d, then in process a %d, b %d", inRedis, byA, byB)
	if inRedis != 6 || byA != 0 || byB != 4 {
		t.Errorf("admitted in Redis %d (want 6), then in process a %d (want 0), b %d (want 4): %d against a limit of 10",
			inRedis, byA, byB, inRedis+byA+byB)
	}
}
