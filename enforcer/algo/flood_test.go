package algo

import (
	"strconv"
	"testing"
	"time"
)

// TestFloodKeepsLimitedCounters exhausts 20 clients (3 per hour), then floods the store,
// bounded to 640 counters, with 5 000 new keys of one request each, and checks that the
// 20 are still denied for every algorithm: a full store evicts the counters that used
// the least of their limits (a third, for the flood's keys), never those at their limit.
// Before, the sample gave up the counter closest to going idle, the oldest: 20 of 20
// exhausted clients were admitted again. Then the store is filled with exhausted
// counters only, and new keys are refused (counted, decided uncounted) rather than one
// of them evicted.
func TestFloodKeepsLimitedCounters(t *testing.T) {
	for _, alg := range all {
		t.Run(alg.String(), func(t *testing.T) {
			s := New(Options{MaxKeys: 640})
			now := time.Unix(1_800_000_000, 0)
			lim := Limit{Requests: 3, Window: time.Hour}
			op := func(key string) Op { return Op{Key: key, Algorithm: alg, Limit: lim, N: 1} }
			for i := range 20 {
				k := "exhausted-" + strconv.Itoa(i)
				for range 3 {
					if !s.Allow(now, op(k)).Allowed {
						t.Fatalf("%s denied within its limit", k)
					}
				}
				if s.Allow(now, op(k)).Allowed {
					t.Fatalf("%s admitted past its limit", k)
				}
			}
			for i := range 5000 {
				now = now.Add(time.Millisecond)
				s.Allow(now, op("flood-"+strconv.Itoa(i)))
			}
			readmitted := 0
			for i := range 20 {
				if s.Allow(now, op("exhausted-"+strconv.Itoa(i))).Allowed {
					readmitted++
				}
			}
			st := s.Stats()
			if readmitted != 0 || st.EvictedLive == 0 || st.Keys > 640 {
				t.Fatalf("%d of 20 exhausted clients admitted again after the flood (%+v)", readmitted, st)
			}
			// Every counter exhausted: new keys are refused, the limited stay limited.
			for i := range 1000 {
				k := "full-" + strconv.Itoa(i)
				for range 4 {
					s.Allow(now, op(k))
				}
			}
			before := s.Stats().Refused
			for i := range 500 {
				s.Allow(now, op("late-"+strconv.Itoa(i)))
			}
			readmitted = 0
			for i := range 20 {
				if s.Allow(now, op("exhausted-"+strconv.Itoa(i))).Allowed {
					readmitted++
				}
			}
			// A few of the flood's counters (a third used) may have outlived the second flood
			// in a sampled store, and make room for late keys: most must be refused.
			if st := s.Stats(); readmitted != 0 || st.Refused-before < 400 || st.Keys > 640 {
				t.Fatalf("store full of exhausted counters: %d of 20 admitted again, %d new keys refused (%+v)", readmitted, st.Refused-before, st)
			}
		})
	}
}
