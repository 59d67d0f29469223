package sitestore

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/streamlimit/streamlimit/enforcer/algo"
	"github.com/streamlimit/streamlimit/enforcer/sitecount"
	"github.com/streamlimit/streamlimit/internal/testenv"
)

// TestCommitWithSiteMatchesApart drives CommitWithSite on Redis and, on the same random
// sequence, the rule it must follow decided in process with sitecount.Local and algo.Store
// (which the Redis Counter and Store match, TestCounterMatchesLocalCounter and
// TestMatchesAlgoStore): the counts are checked against their caps, the site limits are
// decided only if every count fits, and the counts are added only if the site limits are
// taken. Outcomes, counts and site decisions must agree at every step, and every step must
// be one script call.
func TestCommitWithSiteMatchesApart(t *testing.T) {
	client := testenv.RedisClient(t)
	reg := prometheus.NewRegistry()
	s := newStore(t, client, testenv.KeyPrefix(t), func(c *Config) {
		c.ExpirySlack = time.Hour // Redis's real-time TTLs stay out of this fake-time comparison
		c.Registerer = reg
	})
	rc := NewCounter(s, CounterOptions{})
	lc := sitecount.NewLocal(sitecount.LocalOptions{SubBuckets: 60, Interpolate: true})
	ls := algo.New(algo.Options{})
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(3, 11))
	now := t0
	gkeys := []string{"g|u=a#10s", "g|u=b#10s", "g|u=c#10s"}
	skeys := []string{"s|t=x#1s", "s|t=y#1s", "s|t=z#1s"}
	limits := testLimits()[:3]
	algs := []algo.Algorithm{algo.SlidingWindow, algo.FixedWindow, algo.TokenBucket}
	var taken, siteRefused, globalRefused int
	const steps = 500
	for step := range steps {
		now = now.Add(time.Duration(rng.Int64N(int64(300 * time.Millisecond))))
		// Distinct keys within one request, in each half.
		ng, ns := 1+rng.IntN(2), 1+rng.IntN(2)
		gperm, sperm := rng.Perm(len(gkeys)), rng.Perm(len(skeys))
		ops := make([]sitecount.Op, ng)
		for i := range ops {
			c := 10 + 20*rng.Float64() // around the counts the load keeps
			switch rng.IntN(12) {
			case 0:
				c = math.Inf(1)
			case 1:
				c = math.Inf(-1)
			}
			ops[i] = sitecount.Op{Key: gkeys[gperm[i]], Window: 10 * time.Second, N: 1 + rng.Int64N(2), Cap: c}
		}
		sops := make([]algo.Op, ns)
		for i := range sops {
			k := sperm[i]
			sops[i] = algo.Op{Key: skeys[k], Algorithm: algs[k], Limit: limits[k], N: 1 + rng.Int64N(3)}
		}

		before := testutil.ToFloat64(s.m.batches)
		counts := make([]float64, ng)
		sout := make([]algo.Decision, ns)
		j := rc.CommitWithSite(ctx, now, s, ops, counts, sops, sout)
		if got := testutil.ToFloat64(s.m.batches) - before; got != 1 {
			t.Fatalf("step %d: %v script calls, want 1", step, got)
		}

		// The rule, in process.
		wcounts := make([]float64, ng)
		_ = lc.Counts(ctx, now, ops, wcounts)
		fits := true
		for i := range ops {
			if wcounts[i]+float64(ops[i].N) > ops[i].Cap {
				fits = false
			}
		}
		want := sitecount.Joint{Done: true}
		wout := make([]algo.Decision, ns)
		if fits {
			want.SiteRan = true
			want.SiteOK = ls.AllowAll(now, sops, wout)
			if want.SiteOK {
				want.Taken = true
				add := append([]sitecount.Op(nil), ops...)
				for i := range add {
					add[i].Cap = math.Inf(1)
				}
				_, _ = lc.Commit(ctx, now, add, nil)
			}
		}
		if j != want {
			t.Fatalf("step %d at %v: %+v, want %+v (ops %+v, counts %v, site %+v)", step, now.Sub(t0), j, want, ops, wcounts, sops)
		}
		for i := range ops {
			if !near(counts[i], wcounts[i]) {
				t.Fatalf("step %d: counts %v, want %v", step, counts, wcounts)
			}
		}
		if j.SiteRan {
			for i := range sops {
				if sout[i] != wout[i] {
					t.Fatalf("step %d: site op %d of %+v\n redis %+v\n algo  %+v", step, i, sops, sout[i], wout[i])
				}
			}
		}
		switch {
		case j.Taken:
			taken++
		case j.SiteRan:
			siteRefused++
		default:
			globalRefused++
		}
	}
	t.Logf("%d steps: %d taken, %d refused by the site limits, %d by the counts", steps, taken, siteRefused, globalRefused)
	if taken < 50 || siteRefused < 50 || globalRefused < 50 {
		t.Fatalf("%d taken, %d refused by the site limits, %d by the counts: the sequence does not exercise every outcome", taken, siteRefused, globalRefused)
	}
}

// TestCommitWithSiteNotDone checks the cases CommitWithSite leaves to the calls apart, and
// that it then does nothing: another store, an op outside the exact range, and site ops all
// known over their limit.
func TestCommitWithSiteNotDone(t *testing.T) {
	client := testenv.RedisClient(t)
	s := newStore(t, client, testenv.KeyPrefix(t), nil)
	other := newStore(t, client, testenv.KeyPrefix(t)+"o:", nil)
	rc := NewCounter(s, CounterOptions{})
	ctx := context.Background()
	now := time.Now()
	gop := []sitecount.Op{{Key: "g|u=a#10s", Window: 10 * time.Second, N: 1, Cap: 100}}
	lim := algo.Limit{Requests: 1, Window: time.Minute}
	sop := []algo.Op{{Key: "s|t=x#1m", Algorithm: algo.SlidingWindow, Limit: lim, N: 1}}
	counts := make([]float64, 1)
	sout := make([]algo.Decision, 1)
	if j := rc.CommitWithSite(ctx, now, other, gop, counts, sop, sout); j.Done {
		t.Fatalf("another store: %+v, want not done", j)
	}
	huge := []algo.Op{{Key: "s|t=y#1m", Algorithm: algo.SlidingWindow, Limit: algo.Limit{Requests: 1 << 60, Window: time.Minute}, N: 1}}
	if j := rc.CommitWithSite(ctx, now, s, gop, counts, huge, sout); j.Done {
		t.Fatalf("an op outside the exact range: %+v, want not done", j)
	}
	// Fill the site limit (1 a minute), then it is known over its limit.
	if j := rc.CommitWithSite(ctx, now, s, gop, counts, sop, sout); !j.Taken {
		t.Fatalf("first request: %+v, want taken", j)
	}
	if j := rc.CommitWithSite(ctx, now, s, gop, counts, sop, sout); !j.Done || j.Taken || !j.SiteRan || j.SiteOK {
		t.Fatalf("second request: %+v, want refused by the site limit", j)
	}
	if j := rc.CommitWithSite(ctx, now, s, gop, counts, sop, sout); j.Done {
		t.Fatalf("third request, the site limit known over: %+v, want not done (the over-limit cache refuses it without a call)", j)
	}
	// The global count holds the one request taken, not the refused ones.
	if err := rc.Counts(ctx, now, gop, counts); err != nil || counts[0] != 1 {
		t.Fatalf("global count %v (%v), want 1", counts[0], err)
	}
}

// TestCommitWithSiteRedisDown: with Redis down, CommitWithSite decides in process, both
// halves reported as fallbacks, all or nothing as with Redis: a request the site limit
// refuses adds nothing to the counts, and one the counts refuse takes nothing from the
// site limit.
func TestCommitWithSiteRedisDown(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, deadRedis(t), "jd:", nil)
	rc := NewCounter(s, CounterOptions{})
	gop := []sitecount.Op{{Key: "g|u=a#1m", Window: time.Minute, N: 1, Cap: 3}}
	sop := []algo.Op{{Key: "s|t=x#1m", Algorithm: algo.FixedWindow, Limit: algo.Limit{Requests: 2, Window: time.Minute}, N: 1}}
	counts := make([]float64, 1)
	sout := make([]algo.Decision, 1)
	var got []bool
	for range 2 {
		j := rc.CommitWithSite(ctx, t0, s, gop, counts, sop, sout)
		if !j.Done || !j.GlobalFellBack || !j.SiteFellBack {
			t.Fatalf("Redis down: %+v, want done by the fallbacks", j)
		}
		got = append(got, j.Taken)
	}
	// The site limit (2) is spent: refused, and the count stays at 2.
	if j := rc.CommitWithSite(ctx, t0, s, gop, counts, sop, sout); j.Taken || !j.SiteRan || j.SiteOK {
		t.Fatalf("third request: %+v, want refused by the site limit", j)
	}
	if err := rc.Fallback().Counts(ctx, t0, gop, counts); err != nil || counts[0] != 2 {
		t.Fatalf("fallback count %v (%v), want 2: a request the site limit refused added to it", counts[0], err)
	}
	// A cap the count already meets refuses before the site limit is asked: it keeps its room.
	other := []algo.Op{{Key: "s|t=y#1m", Algorithm: algo.FixedWindow, Limit: algo.Limit{Requests: 1, Window: time.Minute}, N: 1}}
	full := []sitecount.Op{{Key: "g|u=a#1m", Window: time.Minute, N: 1, Cap: 2}}
	if j := rc.CommitWithSite(ctx, t0, s, full, counts, other, sout); j.Taken {
		t.Fatalf("a full cap: %+v, want refused", j)
	}
	if ok, _ := s.AllowAll(ctx, t0, other, sout); !ok {
		t.Fatal("the site limit a request refused by its counts was asked for has no room left")
	}
	if !got[0] || !got[1] {
		t.Fatalf("first two requests taken %v, want both", got)
	}
}
