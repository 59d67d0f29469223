package snapshot

import (
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/streamlimit/streamlimit/clock"
	"github.com/streamlimit/streamlimit/topics"
)

// TestMaxBytes fills a snapshot bounded in bytes: counts for new keys are refused once
// their entries would pass the bound (ErrFull, counted), updates of held keys still
// apply, and tombstones and the sweep give the bytes back.
func TestMaxBytes(t *testing.T) {
	const budget = 64 << 10
	f := newFixture(t, Config{MaxBytes: budget})
	s := f.s
	held, refused := 0, 0
	for i := range 2000 {
		k := "api|user=" + strconv.Itoa(i) + "#60s"
		err := s.Apply([]byte(k), countValue(t, k, time.Minute, t0, map[string]float64{"eu": 1, "us": 2}))
		switch {
		case err == nil:
			held++
		case errors.Is(err, ErrFull):
			refused++
		default:
			t.Fatal(err)
		}
	}
	if s.Bytes() > budget || held == 0 || refused == 0 || s.Len() != held {
		t.Fatalf("%d bytes (bound %d), %d held, %d refused, Len %d", s.Bytes(), budget, held, refused, s.Len())
	}
	if got := f.metric(t, "streamlimit_snapshot_refused_keys_total"); got != float64(refused) {
		t.Errorf("refused_keys_total %v, want %d", got, refused)
	}
	// A held key's update applies, with more sites.
	k := "api|user=0#60s"
	if err := s.Apply([]byte(k), countValue(t, k, time.Minute, t0, map[string]float64{"eu": 1, "us": 2, "ap": 3})); err != nil {
		t.Fatal(err)
	}
	if e, _ := s.Get(k); e.Total != 6 {
		t.Fatalf("update not applied: %+v", e)
	}
	if err := s.Apply([]byte(k), nil); err != nil {
		t.Fatal(err)
	}
	if n := s.Sweep(t0.Add(2 * time.Minute)); n != held-1 || s.Bytes() != 0 {
		t.Fatalf("swept %d of %d, %d bytes left", n, held-1, s.Bytes())
	}
}

// TestFullSnapshotSweepsExpiredFirst: a full snapshot makes room for a new key by
// dropping counts whose windows have passed (before, the new key was refused until the
// next periodic sweep, up to 10 s later), and refuses it, keeping every count still in its
// window, when none has.
func TestFullSnapshotSweepsExpiredFirst(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC))
	s, err := NewMemory(Config{Site: "eu", Clock: clk, MaxKeys: 10})
	if err != nil {
		t.Fatal(err)
	}
	put := func(key string, window int64) error {
		c := topics.Count{Key: key, Window: window, AsOf: clk.Now().UnixMilli(), Total: 3,
			Sites: []topics.SiteCount{{Site: "eu", Count: 3, Demand: 3}}}
		v, _ := c.MarshalBinary()
		return s.Apply([]byte(key), v)
	}
	for i := range 5 {
		if put(fmt.Sprint("short-", i), 1000) != nil || put(fmt.Sprint("long-", i), 3_600_000) != nil {
			t.Fatal("filling")
		}
	}
	if err := put("new-0", 3_600_000); !errors.Is(err, ErrFull) {
		t.Fatalf("a new key in a full snapshot: %v, want ErrFull", err)
	}
	clk.Advance(2 * time.Second) // the short windows have passed
	for i := range 5 {
		if err := put(fmt.Sprint("new-", i), 3_600_000); err != nil {
			t.Fatalf("new-%d after the short counts expired: %v", i, err)
		}
	}
	if err := put("new-5", 3_600_000); !errors.Is(err, ErrFull) {
		t.Fatalf("new-5: %v, want ErrFull", err)
	}
	for i := range 5 {
		if _, ok := s.Get(fmt.Sprint("long-", i)); !ok {
			t.Fatalf("long-%d, still in its window, was dropped", i)
		}
	}
}
