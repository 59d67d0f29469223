package sitestore

import (
	"context"
	"testing"
	"time"

	"github.com/streamlimit/streamlimit/enforcer/algo"
	"github.com/streamlimit/streamlimit/internal/testenv"
)

// A calendar month in Redis decides as algo.Store does across the boundary, reports the
// boundary as Retry-After and reset, and its hash expires at the boundary (plus the slack).
func TestCalendarMonthInRedis(t *testing.T) {
	client := testenv.RedisClient(t)
	s := newStore(t, client, testenv.KeyPrefix(t), nil)
	ls := algo.New(algo.Options{})
	ctx := context.Background()
	op := algo.Op{Key: "d|plan=pro#2592000s", Algorithm: algo.FixedWindowOn(algo.Month), N: 1,
		Limit: algo.Limit{Requests: 2, Window: 30 * 24 * time.Hour}}
	allow := func(now time.Time) algo.Decision {
		t.Helper()
		out := make([]algo.Decision, 1)
		ok, fb := s.AllowAll(ctx, now, []algo.Op{op}, out)
		if fb {
			t.Fatalf("%v: decided in process", now)
		}
		if want := ls.Allow(now, op); out[0] != want || ok != want.Allowed {
			t.Fatalf("%v: Redis %+v (allowed %v), in process %+v", now, out[0], ok, want)
		}
		return out[0]
	}
	pttl := func() time.Duration {
		t.Helper()
		d, err := client.PTTL(ctx, s.redisKey(op.Key)).Result()
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	jan := time.Date(2026, 1, 31, 23, 59, 58, 0, time.UTC)
	allow(jan)
	set := time.Now() // the TTL is counted on Redis's wall clock from here
	allow(jan)
	if ttl := pttl(); ttl <= 2*time.Second-time.Since(set) || ttl > 3*time.Second {
		t.Fatalf("TTL on Jan 31st, 2 s before February = %v, want 2 s + 1 s of slack (less the %v since it was set)", ttl, time.Since(set))
	}
	if d := allow(jan.Add(time.Second)); d.Allowed || d.RetryAfter != time.Second || d.ResetAfter != time.Second {
		t.Fatalf("3rd in January: %+v, want denied until Feb 1st (1s)", d)
	}
	feb := time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC)
	if d := allow(feb); !d.Allowed || d.Remaining != 1 || d.ResetAfter != 28*24*time.Hour {
		t.Fatalf("first in February: %+v, want admitted, 1 left, reset at Mar 1st", d)
	}
	if ttl := pttl(); ttl <= 28*24*time.Hour || ttl > 28*24*time.Hour+time.Second {
		t.Fatalf("TTL on Feb 1st = %v, want 28 days + 1 s of slack", ttl)
	}
}

// A request stamped before a month that another caller has already started counts in that
// month, and keeps its hash until that month's end: for a 31-day month that is longer than
// the limit's nominal 30 days.
func TestCalendarLateRequestKeepsTheLongerMonth(t *testing.T) {
	client := testenv.RedisClient(t)
	s := newStore(t, client, testenv.KeyPrefix(t), nil)
	ctx := context.Background()
	op := algo.Op{Key: "d|plan=pro#2592000s", Algorithm: algo.FixedWindowOn(algo.Month), N: 1,
		Limit: algo.Limit{Requests: 5, Window: 30 * 24 * time.Hour}}
	out := make([]algo.Decision, 1)
	aug := time.Date(2026, 8, 1, 0, 0, 0, 0, time.UTC)
	if ok, fb := s.AllowAll(ctx, aug, []algo.Op{op}, out); !ok || fb {
		t.Fatalf("Aug 1st: allowed %v fellBack %v", ok, fb)
	}
	if ok, fb := s.AllowAll(ctx, aug.Add(-time.Second), []algo.Op{op}, out); !ok || fb {
		t.Fatalf("late, stamped Jul 31st: allowed %v fellBack %v", ok, fb)
	}
	ttl, err := client.PTTL(ctx, s.redisKey(op.Key)).Result()
	if err != nil {
		t.Fatal(err)
	}
	if ttl < 31*24*time.Hour {
		t.Fatalf("TTL after the late request = %v, shorter than August (31 days)", ttl)
	}
	if d, fb := s.Peek(ctx, aug.Add(time.Hour), op); fb || d.Remaining != 3 {
		t.Fatalf("August after both: %+v (fellBack %v), want 3 remaining", d, fb)
	}
}

// A calendar year is kept in Redis (not decided in process) and resets on January 1st.
func TestCalendarYearInRedis(t *testing.T) {
	s := newStore(t, testenv.RedisClient(t), testenv.KeyPrefix(t), nil)
	ctx := context.Background()
	op := algo.Op{Key: "d|org=a#31536000s", Algorithm: algo.FixedWindowOn(algo.Year), N: 1,
		Limit: algo.Limit{Requests: 1, Window: 365 * 24 * time.Hour}}
	out := make([]algo.Decision, 1)
	for _, c := range []struct {
		at    time.Time
		allow bool
		retry time.Duration
	}{
		{time.Date(2027, 12, 31, 23, 0, 0, 0, time.UTC), true, 0},
		{time.Date(2027, 12, 31, 23, 30, 0, 0, time.UTC), false, 30 * time.Minute},
		{time.Date(2028, 1, 1, 0, 0, 0, 0, time.UTC), true, 0},
	} {
		ok, fb := s.AllowAll(ctx, c.at, []algo.Op{op}, out)
		if fb || ok != c.allow || out[0].RetryAfter != c.retry {
			t.Fatalf("%v: allowed %v fellBack %v %+v; want allowed %v, retry %v, in Redis", c.at, ok, fb, out[0], c.allow, c.retry)
		}
	}
}
