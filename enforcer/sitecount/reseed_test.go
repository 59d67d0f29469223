package sitecount

import (
	"context"
	"testing"
	"time"
)

// A restarted counter given its site's earlier hits (Seed) lets go of them as the snapshot
// shows them leave (Reseed), and counts every hit it admits itself from then on: its own
// hits after the instant the snapshot has heard the site up to are not taken for hits
// before it. Taking hits away from the seeded bucket once used to widen its span to the
// whole bucket, which made part of the seeded hits look older than that instant and every
// later hit of this instance look counted by the snapshot already: each admission then
// forgot one seeded hit, the count stood still, and the process admitted as many again as
// it had been given.
func TestLocalReseedCountsOwnHits(t *testing.T) {
	ctx := context.Background()
	c := NewLocal(LocalOptions{SubBuckets: 60})
	base := time.Unix(1_700_000_000, 0)
	at := base.UnixMilli() + 25_000 // the snapshot's as-of time when seeded
	now := time.UnixMilli(at + 29)
	op := Op{Key: "k", Window: 10 * time.Second, N: 1, Cap: 1e9}
	c.Seed(now, &op, 56, at)
	count := func() float64 {
		out := []float64{0}
		if err := c.Counts(ctx, now, []Op{op}, out); err != nil {
			t.Fatal(err)
		}
		return out[0]
	}
	// The snapshot, having heard the site up to at, counts 55 of its hits: one of the
	// seeded hits has left the window.
	now = time.UnixMilli(at + 547)
	c.Reseed(now, &op, 55, at)
	if got := count(); got != 55 {
		t.Fatalf("after the first Reseed: count %v, want 55", got)
	}
	for i := range 10 {
		if ok, err := c.Commit(ctx, now, []Op{op}, nil); !ok || err != nil {
			t.Fatal(ok, err)
		}
		now = now.Add(10 * time.Millisecond)
		c.Reseed(now, &op, 55, at) // the snapshot has not moved
		if got, want := count(), float64(56+i); got != want {
			t.Fatalf("after %d own hits: count %v, want %v", i+1, got, want)
		}
	}
}
