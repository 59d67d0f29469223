package algo

import (
	"math/rand/v2"
	"testing"
	"time"
)

// logOf returns the sliding-log entry of key in s.
func logOf(s *Store, key string) *entry {
	sh := &s.shards[s.shardOf(key)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return sh.m[key]
}

// One request of ten million hits is one log entry, not ten million timestamps: a large
// hits_addend costs no memory.
func TestSlidingLogEntryCarriesCount(t *testing.T) {
	s := New(Options{})
	op := Op{Key: "k", Algorithm: SlidingLog, Limit: Limit{Requests: 30_000_000, Window: time.Hour}, N: 10_000_000}
	out := make([]Decision, 1)
	if !s.AllowAll(base, []Op{op}, out) || out[0].Remaining != 20_000_000 {
		t.Fatalf("first: %+v", out[0])
	}
	if !s.AllowAll(base.Add(time.Second), []Op{op}, out) || out[0].Remaining != 10_000_000 {
		t.Fatalf("second: %+v", out[0])
	}
	if e := logOf(s, "k"); len(e.log) > 8 || e.total != 20_000_000 {
		t.Fatalf("log of %d entries holding %d hits; want ≤ 8 entries", len(e.log), e.total)
	}
	// The first 10 M leave the window an hour after they came, not before.
	op.N = 20_000_000
	if d := s.Peek(base.Add(time.Hour-time.Nanosecond), op); d.Allowed || d.RetryAfter != time.Nanosecond {
		t.Fatalf("just before the first entry leaves: %+v", d)
	}
	if d := s.Peek(base.Add(time.Hour), op); !d.Allowed {
		t.Fatalf("once the first entry has left: %+v", d)
	}
}

// Past MaxLogEntries, hits are merged into the newest entry: memory stays bounded, and in
// no sliding window are more hits admitted than the limit (coalescing only denies more).
func TestSlidingLogCoalescesPastTheBound(t *testing.T) {
	s := New(Options{})
	const limit = 5000
	l := Limit{Requests: limit, Window: time.Second}
	rng := rand.New(rand.NewPCG(1, 2))
	type adm struct {
		at time.Time
		n  int64
	}
	var admitted []adm
	out := make([]Decision, 1)
	now := base
	most := 0
	for range 40_000 {
		now = now.Add(time.Duration(rng.IntN(200)) * time.Microsecond)
		op := Op{Key: "k", Algorithm: SlidingLog, Limit: l, N: int64(1 + rng.IntN(3))}
		if s.AllowAll(now, []Op{op}, out) {
			admitted = append(admitted, adm{now, op.N})
		}
		e := logOf(s, "k")
		if e.n > MaxLogEntries || len(e.log) > MaxLogEntries {
			t.Fatalf("log holds %d entries (ring %d), bound %d", e.n, len(e.log), MaxLogEntries)
		}
		most = max(most, e.n)
	}
	if most != MaxLogEntries {
		t.Fatalf("the log never reached its bound (at most %d entries): nothing was coalesced", most)
	}
	// Every window ending at an admission holds at most the limit.
	lo := 0
	var in int64
	for _, a := range admitted {
		in += a.n
		for a.at.Sub(admitted[lo].at) >= l.Window {
			in -= admitted[lo].n
			lo++
		}
		if in > limit {
			t.Fatalf("%d hits admitted in the window ending at %v, limit %d", in, a.at.Sub(base), limit)
		}
	}
	if len(admitted) < 1000 {
		t.Fatalf("only %d requests admitted: coalescing denies far too much", len(admitted))
	}
}

// An AllowAll that fails undoes a merge into the newest entry as well as a new entry.
func TestSlidingLogRollbackOfMerge(t *testing.T) {
	s := New(Options{})
	l := Limit{Requests: 5, Window: time.Minute}
	one := Op{Key: "l", Algorithm: SlidingLog, Limit: l, N: 1}
	out := make([]Decision, 3)
	if !s.AllowAll(base, []Op{one}, out) {
		t.Fatal("first")
	}
	// At the same instant: merged into the first entry, then the third op fails.
	three := one
	three.N = 3
	if s.AllowAll(base, []Op{one, three, three}, out) {
		t.Fatal("1+1+3+3 admitted against 5")
	}
	e := logOf(s, "l")
	if e.n != 1 || e.total != 1 || e.log[e.head].n != 1 || e.log[e.head].ts != base.UnixNano() {
		t.Fatalf("after rollback: %d entries, %d hits, head %+v", e.n, e.total, e.log[e.head])
	}
}
