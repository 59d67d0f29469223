package sitecount

import (
	"context"
	"strconv"
	"testing"
	"time"
	"unsafe"
)

// TestLocalHandlesSurviveEviction checks that a handle whose cached entry was
// evicted or swept looks the key up again instead of counting into a dead entry.
func TestLocalHandlesSurviveEviction(t *testing.T) {
	ctx := context.Background()
	c := NewLocal(LocalOptions{MaxKeys: 64})
	handles := map[string]*Handle{}
	now := time.Unix(1_700_000_000, 0)
	op := func(key string) Op {
		h := handles[key]
		if h == nil {
			h = new(Handle)
			handles[key] = h
		}
		return Op{Key: key, Window: time.Minute, N: 1, Cap: 1e9, Handle: h}
	}
	a := []Op{op("a")}
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
		c.Commit(ctx, now, []Op{k}, nil)
	}
	if c.Len() > 64+64 {
		t.Fatalf("len %d over the bound", c.Len())
	}
	a[0].Window = time.Hour
	c.Counts(ctx, now, a, out)
	if e := a[0].Handle.e.Load(); e != nil && !e.dead {
		if got := c.shards[e.shard].m["a"]; got != e {
			t.Fatalf("handle points at an entry that is not in the map")
		}
	}
}

// TestLocalMaxBytes commits many keys into a counter bounded in bytes: the bytes
// stay within the bound, live counters are evicted and counted, and a request's own
// counters, new or old, are never the ones evicted for its other keys.
func TestLocalMaxBytes(t *testing.T) {
	ctx := context.Background()
	const budget = 64 * 4 << 10 // 4 KiB a shard: five counters
	c := NewLocal(LocalOptions{MaxBytes: budget})
	now := time.Unix(1_700_000_000, 0)
	for i := range 5000 {
		ops := []Op{
			{Key: "a" + strconv.Itoa(i), Window: time.Minute, N: 1, Cap: 1e9},
			{Key: "b" + strconv.Itoa(i), Window: time.Minute, N: 1, Cap: 1e9},
			{Key: "c" + strconv.Itoa(i%7), Window: time.Minute, N: 1, Cap: 1e9},
		}
		if ok, err := c.Commit(ctx, now, ops, nil); !ok || err != nil {
			t.Fatal(ok, err)
		}
		out := make([]float64, 3)
		if c.Counts(ctx, now, ops, out); out[0] != 1 || out[1] != 1 || out[2] == 0 {
			t.Fatalf("request %d: counts %v just after its commit", i, out)
		}
		if b := c.Bytes(); b > budget {
			t.Fatalf("request %d: %d bytes, bound %d", i, b, budget)
		}
	}
	if c.Evicted() == 0 || c.Len() > budget/entrySize {
		t.Errorf("evicted %d, %d counters held", c.Evicted(), c.Len())
	}
}

// TestEntrySize checks that the byte estimate of a counter is not below its entry's real
// size, or MaxBytes would let more memory be held than it says.
func TestEntrySize(t *testing.T) {
	if size := unsafe.Sizeof(entry{}); size > entrySize {
		t.Errorf("entry is %d bytes, estimated %d", size, entrySize)
	}
}
