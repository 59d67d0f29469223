package sitestore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/streamlimit/streamlimit/enforcer/algo"
	"github.com/streamlimit/streamlimit/internal/testenv"
)

// TestSlidingLogMemory: one request of 50 000 hits costs one list entry, not 50 000. The
// figure it logs (Redis MEMORY USAGE of the list and of the hash) is the one in
// docs/redis.md.
func TestSlidingLogMemory(t *testing.T) {
	client := testenv.RedisClient(t)
	s := newStore(t, client, testenv.KeyPrefix(t), nil)
	ctx := context.Background()
	op := algo.Op{Key: "d|k=big#60s", Algorithm: algo.SlidingLog, Limit: algo.Limit{Requests: 65536, Window: time.Minute}, N: 50000}
	out := make([]algo.Decision, 1)
	if ok, fb := s.AllowAll(ctx, t0, []algo.Op{op}, out); !ok || fb {
		t.Fatalf("allowed %v fellBack %v", ok, fb)
	}
	hk := s.redisKey(op.Key)
	lk := hk + ":log"
	n, err := client.LLen(ctx, lk).Result()
	if err != nil {
		t.Fatal(err)
	}
	listBytes, err := client.MemoryUsage(ctx, lk, 0).Result() // SAMPLES 0: every node, exact
	if err != nil {
		t.Fatal(err)
	}
	hashBytes, err := client.MemoryUsage(ctx, hk, 0).Result()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("one request of %d hits: list %d entries, MEMORY USAGE list %d bytes, hash %d bytes", op.N, n, listBytes, hashBytes)
	if n != 1 {
		t.Errorf("the log holds %d entries after one request, want 1", n)
	}
}

// hitsAddend draws a request's hits_addend: mostly a few, now and then up to 3000, so
// that a log passes algo.MaxLogEntries admission times within its allowance.
func hitsAddend(rng *rand.Rand) int64 {
	if rng.IntN(200) == 0 {
		return 1 + rng.Int64N(3000)
	}
	return 1 + rng.Int64N(2)
}

// TestSlidingLogMatchesInProcess drives the Redis sliding log and package algo's with the
// same random requests (hits_addend 1..3000, several ops per request, random windows,
// gaps of zero, retries at RetryAfter and 1 ns before it) and requires the same Decision
// from both at every step, before and after a log reaches algo.MaxLogEntries entries and
// coalesces. It also checks that the Redis log does reach that many entries and never
// passes it.
func TestSlidingLogMatchesInProcess(t *testing.T) {
	client := testenv.RedisClient(t)
	ctx := context.Background()
	for seed := range uint64(2) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			// The test's clock runs slower than the real one (more so under -race), while
			// Redis expires keys in real time: a long slack keeps a log the test still
			// counts from expiring under it.
			rs := newStore(t, client, testenv.KeyPrefix(t), func(c *Config) { c.ExpirySlack = time.Hour })
			ls := algo.New(algo.Options{})
			rng := rand.New(rand.NewPCG(seed, 7))
			// Windows of 0.5 to 3 s to the nanosecond; allowances of 12 000 to 21 000, so
			// that a log passes algo.MaxLogEntries entries before it is full, and requests
			// a few thousandths of a window apart, so that it does within one window.
			keys := []string{"d|k=a", "d|k=b"}
			limits := make([]algo.Limit, len(keys))
			for i := range limits {
				w := 500*time.Millisecond + time.Duration(rng.Int64N(int64(2500*time.Millisecond)))
				limits[i] = algo.Limit{Requests: 12000 + rng.Int64N(8000), Window: w, SoftPercent: rng.IntN(2) * 5}
			}
			now, lastRetry := t0, time.Duration(0)
			var got, want [3]algo.Decision
			allowed, decided, most := 0, 0, int64(0)
			const steps = 8000
			for step := range steps {
				w := min(limits[0].Window, limits[1].Window)
				switch r := rng.IntN(2000); {
				case r < 40: // the same nanosecond as the last request
				case r < 90:
					if lastRetry > 0 && lastRetry <= w/20 { // a long wait would empty the logs
						now = now.Add(lastRetry - time.Duration(rng.IntN(2)))
					}
				case r < 91:
					now = now.Add(time.Duration(rng.Int64N(int64(w))))
				default:
					now = now.Add(time.Duration(1 + rng.Int64N(int64(w)/1500)))
				}
				ops := make([]algo.Op, 1+rng.IntN(3))
				for i := range ops {
					k := rng.IntN(len(keys))
					ops[i] = algo.Op{Key: keys[k], Algorithm: algo.SlidingLog, Limit: limits[k], N: hitsAddend(rng)}
				}
				if rng.IntN(10) == 0 {
					d, fb := rs.Peek(ctx, now, ops[0])
					if wd := ls.Peek(now, ops[0]); fb || d != wd {
						t.Fatalf("step %d: Peek %+v (fellBack %v)\n redis %+v\n algo  %+v", step, ops[0], fb, d, wd)
					}
					continue
				}
				ok, fb := rs.AllowAll(ctx, now, ops, got[:])
				wok := ls.AllowAll(now, ops, want[:])
				if fb || ok != wok {
					t.Fatalf("step %d at %v: allowed %v (fellBack %v), algo %v, for %+v", step, now.Sub(t0), ok, fb, wok, ops)
				}
				lastRetry = 0
				for i := range ops {
					if got[i] != want[i] {
						t.Fatalf("step %d at %v: op %d of %+v\n redis %+v\n algo  %+v", step, now.Sub(t0), i, ops, got[i], want[i])
					}
					if !want[i].Allowed {
						lastRetry = max(lastRetry, want[i].RetryAfter)
					}
				}
				decided++
				if ok {
					allowed++
				}
				if step%5 == 0 { // often enough to see the longest log
					for _, k := range keys {
						n, err := client.LLen(ctx, rs.redisKey(k)+":log").Result()
						if err != nil {
							t.Fatal(err)
						}
						most = max(most, n)
					}
				}
			}
			if allowed < decided/10 || allowed > decided*9/10 {
				t.Errorf("%d of %d requests allowed: the sequence does not exercise both outcomes", allowed, decided)
			}
			if most != algo.MaxLogEntries {
				t.Errorf("the longest log held %d entries, want it to reach algo.MaxLogEntries (%d) and stop there", most, algo.MaxLogEntries)
			}
		})
	}
}

// TestSlidingLogCoalescesPastTheCap fills a log with algo.MaxLogEntries admission times,
// adds hits past them, and looks when an exact log would have let some of those hits
// leave: both stores keep them, in the newest entry, whose time moved to the last of them.
func TestSlidingLogCoalescesPastTheCap(t *testing.T) {
	client := testenv.RedisClient(t)
	rs := newStore(t, client, testenv.KeyPrefix(t), nil)
	ls := algo.New(algo.Options{})
	ctx := context.Background()
	op := algo.Op{Key: "d|k=cap", Algorithm: algo.SlidingLog, Limit: algo.Limit{Requests: 5000, Window: time.Second}, N: 1}
	at := func(i int) time.Time { return t0.Add(time.Duration(i) * 100 * time.Microsecond) }
	var got, want [1]algo.Decision
	const extra = 10 // hits past the cap, one per request
	for i := range algo.MaxLogEntries + extra {
		ok, fb := rs.AllowAll(ctx, at(i), []algo.Op{op}, got[:])
		if wok := ls.AllowAll(at(i), []algo.Op{op}, want[:]); !ok || !wok || fb || got != want {
			t.Fatalf("request %d: allowed %v (fellBack %v), algo %v\n redis %+v\n algo  %+v", i, ok, fb, wok, got[0], want[0])
		}
	}
	lk := rs.redisKey(op.Key) + ":log"
	if n := client.LLen(ctx, lk).Val(); n != algo.MaxLogEntries {
		t.Errorf("the log holds %d entries, want %d", n, algo.MaxLogEntries)
	}
	newest := algo.MaxLogEntries + extra - 1
	// One request of two ops on the key: the first joins the newest entry, moving it to
	// now; the second is denied until its j-th oldest hit leaves, j within that entry, so
	// a whole window from now.
	var got2, want2 [2]algo.Decision
	held := int64(algo.MaxLogEntries + extra + 1) // with the first op's hit
	j := held - 5
	two := []algo.Op{op, op}
	two[1].N = op.Limit.Requests - held + j
	ok, fb := rs.AllowAll(ctx, at(newest+1), two, got2[:])
	wok := ls.AllowAll(at(newest+1), two, want2[:])
	if ok || wok || fb || got2 != want2 {
		t.Fatalf("two ops: allowed %v (fellBack %v), algo %v\n redis %+v\n algo  %+v", ok, fb, wok, got2, want2)
	}
	if got2[1].RetryAfter != time.Second {
		t.Errorf("RetryAfter %v, want the window (the j-th oldest hit is in the newest entry, now at now)", got2[1].RetryAfter)
	}
	// A window after request 1030: an exact log would hold requests 1031..1033 only; the
	// coalesced one holds the newest entry whole, its first hit and the 10 after it.
	now := at(1030).Add(time.Second)
	d, fb := rs.Peek(ctx, now, op)
	if w := ls.Peek(now, op); fb || d != w {
		t.Fatalf("Peek (fellBack %v)\n redis %+v\n algo  %+v", fb, d, w)
	}
	if held := op.Limit.Requests - d.Remaining; held != extra+1 {
		t.Errorf("%d hits in the window, want the newest entry's %d", held, extra+1)
	}
	if want := at(newest).Add(time.Second).Sub(now); d.ResetAfter != want {
		t.Errorf("ResetAfter %v, want %v (the newest entry's time moved to its last hit)", d.ResetAfter, want)
	}
}

// TestSlidingLogReadsOldFormat writes a log as it was kept before entries carried counts
// (one bare "<ns>" element per hit, the hash's cur 0) and checks that the store reads it
// as those hits: the same decisions as the in-process log that admitted them, and, for a
// log longer than algo.MaxLogEntries, its hits counted and new hits added to its newest
// entry.
func TestSlidingLogReadsOldFormat(t *testing.T) {
	client := testenv.RedisClient(t)
	ctx := context.Background()
	writeOld := func(t *testing.T, rs *Store, op algo.Op, times []time.Time) {
		t.Helper()
		hk := rs.redisKey(op.Key)
		elems := make([]any, len(times))
		for i, at := range times {
			elems[i] = strconv.FormatInt(at.UnixNano(), 10)
		}
		p := client.TxPipeline()
		p.HSet(ctx, hk, "alg", int(op.Algorithm), "w", strconv.FormatInt(int64(op.Limit.Window), 10), "ts", "0", "tn", "0",
			"tr", "0", "d", strconv.FormatInt(op.Limit.Allowance(), 10), "st", "", "cur", "0", "prev", "0")
		p.RPush(ctx, hk+":log", elems...)
		p.PExpire(ctx, hk, time.Hour)
		p.PExpire(ctx, hk+":log", time.Hour)
		if _, err := p.Exec(ctx); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("same decisions", func(t *testing.T) {
		rs := newStore(t, client, testenv.KeyPrefix(t), nil)
		ls := algo.New(algo.Options{})
		rng := rand.New(rand.NewPCG(3, 9))
		op := algo.Op{Key: "d|k=old", Algorithm: algo.SlidingLog, Limit: algo.Limit{Requests: 400, Window: time.Second}, N: 1}
		// 300 hits over 0.9 s, some at the same nanosecond; the in-process log admits them.
		var times []time.Time
		now := t0
		for range 300 {
			if rng.IntN(5) != 0 {
				now = now.Add(time.Duration(rng.Int64N(int64(6 * time.Millisecond))))
			}
			times = append(times, now)
			var d [1]algo.Decision
			if !ls.AllowAll(now, []algo.Op{op}, d[:]) {
				t.Fatalf("the in-process log denied hit %d", len(times))
			}
		}
		writeOld(t, rs, op, times)
		var got, want [1]algo.Decision
		allowed := 0
		for step := range 400 {
			now = now.Add(time.Duration(rng.Int64N(int64(8 * time.Millisecond))))
			op.N = 1 + rng.Int64N(30)
			ok, fb := rs.AllowAll(ctx, now, []algo.Op{op}, got[:])
			wok := ls.AllowAll(now, []algo.Op{op}, want[:])
			if fb || ok != wok || got != want {
				t.Fatalf("step %d at %v, n %d: allowed %v (fellBack %v), algo %v\n redis %+v\n algo  %+v", step, now.Sub(t0), op.N, ok, fb, wok, got[0], want[0])
			}
			if ok {
				allowed++
			}
		}
		if allowed < 40 || allowed > 360 {
			t.Fatalf("%d of 400 requests allowed: the sequence does not exercise both outcomes", allowed)
		}
	})

	t.Run("longer than the cap", func(t *testing.T) {
		rs := newStore(t, client, testenv.KeyPrefix(t), nil)
		op := algo.Op{Key: "d|k=oldlong", Algorithm: algo.SlidingLog, Limit: algo.Limit{Requests: 65536, Window: time.Second}, N: 5}
		const hits = 2000
		times := make([]time.Time, hits)
		for i := range times {
			times[i] = t0.Add(time.Duration(i) * 100 * time.Microsecond)
		}
		writeOld(t, rs, op, times)
		now := times[hits-1].Add(time.Millisecond)
		var got [1]algo.Decision
		if ok, fb := rs.AllowAll(ctx, now, []algo.Op{op}, got[:]); !ok || fb {
			t.Fatalf("allowed %v fellBack %v", ok, fb)
		}
		if want := op.Limit.Requests - hits - op.N; got[0].Remaining != want {
			t.Errorf("Remaining %d, want %d: the old log's %d hits and this request's %d", got[0].Remaining, want, hits, op.N)
		}
		lk := rs.redisKey(op.Key) + ":log"
		if n := client.LLen(ctx, lk).Val(); n != hits {
			t.Errorf("the log holds %d entries, want %d: past the cap, new hits join the newest entry", n, hits)
		}
		if last, want := client.LIndex(ctx, lk, -1).Val(), fmt.Sprintf("%d:%d", now.UnixNano(), 1+op.N); last != want {
			t.Errorf("newest entry %q, want %q", last, want)
		}
		// Half a window later than the first hits' expiry, half of them have left.
		now = times[hits/2-1].Add(time.Second)
		d, fb := rs.Peek(ctx, now, op)
		if want := op.Limit.Requests - hits/2 - op.N; fb || d.Remaining != want {
			t.Errorf("after the first %d hits left: Remaining %d (fellBack %v), want %d", hits/2, d.Remaining, fb, want)
		}
	})
}
