package algo

import (
	"strconv"
	"testing"
	"time"
)

// TestStoreMaxBytes floods a store bounded in bytes with new keys, and grows sliding logs
// toward MaxLogEntries: the bytes it accounts stay within the bound, the logs' growth
// included, and removing every counter brings them back to zero.
func TestStoreMaxBytes(t *testing.T) {
	const budget = 1 << 20
	s := New(Options{MaxBytes: budget})
	now := time.Unix(1_700_000_000, 0)
	lim := Limit{Requests: 1 << 30, Window: time.Hour}
	for i := range 50_000 {
		s.Allow(now, Op{Key: "api|ip=" + strconv.Itoa(i) + "#1h", Algorithm: SlidingWindow, Limit: lim, N: 1})
	}
	if b := s.Bytes(); b > budget || b < budget/2 {
		t.Errorf("after 50 000 keys: %d bytes, bound %d", b, budget)
	}
	for i := range 400 {
		for j := range 200 {
			s.Allow(now.Add(time.Duration(j)*time.Millisecond), Op{Key: "log" + strconv.Itoa(i), Algorithm: SlidingLog, Limit: lim, N: 1})
		}
	}
	st := s.Stats()
	if st.Bytes > budget {
		t.Errorf("after growing logs: %d bytes, bound %d", st.Bytes, budget)
	}
	if st.EvictedLive == 0 {
		t.Error("nothing evicted")
	}
	if n := s.Sweep(now.Add(3 * time.Hour)); n == 0 || s.Bytes() != 0 {
		t.Errorf("swept %d, %d bytes left", n, s.Bytes())
	}
}
