package snapshot

import (
	"errors"
	"strconv"
	"testing"
	"time"
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
