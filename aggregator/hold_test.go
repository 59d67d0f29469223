package aggregator

import "testing"

// The hold is the replicated records' lag less the local ones', and a clock offset common
// to every site cancels out of it: with every site 100 ms ahead of the aggregator, local
// records (5 ms late) arrive stamped 95 ms ahead of its clock. Those negative lags were
// dropped, which left the local estimate empty (or biased to the late records) and held
// local records too little: one client spread over three data centers got 1.28× its limit
// in the simulator.
func TestHoldCancelsCommonClockOffset(t *testing.T) {
	for _, offset := range []int64{0, 100, -100} {
		h := holder{max: 2000}
		for i := range int64(200) {
			now := 1_000_000 + i*10
			h.sample(now, now-5+offset, false)
			h.sample(now, now-155+offset, true)
		}
		if d := h.delay(); d != 150 {
			t.Errorf("sites %d ms ahead: hold %d ms, want 150", offset, d)
		}
	}
}
