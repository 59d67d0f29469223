package enforcer

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/streamlimit/streamlimit/aggregator/window"
)

// TestLocalRingMatchesWindow checks that the LocalCounter's ring counts exactly like
// package window's, for adds at the clock's bucket with a clock that mostly moves forward.
func TestLocalRingMatchesWindow(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, tc := range []struct {
		w   time.Duration
		sub int
	}{{time.Minute, 60}, {time.Second, 60}, {7 * time.Second, 3}, {time.Hour, 100}, {50 * time.Millisecond, 60}} {
		spec := window.NewSpec(tc.w, tc.sub, 0)
		var want window.Ring
		var got localRing
		ms := int64(1_700_000_000_000)
		for step := range 5000 {
			switch rng.IntN(10) {
			case 0:
				ms += rng.Int64N(3 * spec.Window) // idle gap, possibly past the ring
			case 1:
				ms -= rng.Int64N(spec.Width * 2) // the clock went back a little
			default:
				ms += rng.Int64N(spec.Width)
			}
			b := spec.Bucket(ms)
			n := rng.Int64N(5)
			want.Add(&spec, b, b, n)
			got.add(&spec, b, n)
			for range 3 {
				at := ms + rng.Int64N(2*spec.Window)
				if w, g := want.Count(&spec, at), got.count(&spec, at); w != g {
					t.Fatalf("window %v sub %d step %d at %d: count %v, window.Ring says %v", tc.w, tc.sub, step, at, g, w)
				}
			}
		}
	}
}

// TestLocalCounterHandlesSurviveEviction checks that a handle whose cached entry was
// evicted or swept looks the key up again instead of counting into a dead entry.
func TestLocalCounterHandlesSurviveEviction(t *testing.T) {
	ctx := context.Background()
	c := NewLocalCounter(LocalCounterOptions{MaxKeys: 64})
	var kc keyCache
	kc.init(1 << 10)
	now := time.Unix(1_700_000_000, 0)
	op := func(key string) GlobalOp {
		return GlobalOp{Key: key, Window: time.Minute, N: 1, Cap: 1e9, h: kc.handle([]byte(key))}
	}
	a := []GlobalOp{op("a")}
	for range 3 {
		if ok, err := c.Commit(ctx, now, a, nil); !ok || err != nil {
			t.Fatal(ok, err)
		}
	}
	out := []float64{0}
	if c.Counts(ctx, now, a, out); out[0] != 3 {
		t.Fatalf("count %v, want 3", out[0])
	}
	// Idle past the window: swept, then counted afresh through the same handle.
	now = now.Add(2 * time.Minute)
	if n := c.Sweep(now); n != 1 {
		t.Fatalf("swept %d, want 1", n)
	}
	if ok, _ := c.Commit(ctx, now, a, nil); !ok {
		t.Fatal("denied")
	}
	if c.Counts(ctx, now, a, out); out[0] != 1 || c.Len() != 1 {
		t.Fatalf("count %v len %d, want 1 and 1", out[0], c.Len())
	}
	// A window change restarts the counter.
	a[0].Window = time.Hour
	if c.Counts(ctx, now, a, out); out[0] != 0 {
		t.Fatalf("count for another window %v, want 0", out[0])
	}
	if ok, _ := c.Commit(ctx, now, a, nil); !ok {
		t.Fatal("denied")
	}
	a[0].Window = time.Minute
	if c.Counts(ctx, now, a, out); out[0] != 0 {
		t.Fatalf("count of the replaced counter %v, want 0", out[0])
	}
	// Flood the shards so that "a" is evicted; its handle must not resurrect it.
	for i := range 10_000 {
		k := op(string(rune('b'+i%20)) + time.Duration(i).String())
		c.Commit(ctx, now, []GlobalOp{k}, nil)
	}
	if c.Len() > 64+64 {
		t.Fatalf("len %d over the bound", c.Len())
	}
	a[0].Window = time.Hour
	c.Counts(ctx, now, a, out)
	if e := a[0].h.ring.Load(); e != nil && !e.dead {
		if got := c.shards[e.shard].m["a"]; got != e {
			t.Fatalf("handle points at an entry that is not in the map")
		}
	}
}
