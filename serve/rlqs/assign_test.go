package rlqs

import (
	"math"
	"testing"
)

// TestAheadPlausible checks what a key's other holders are taken to admit until their
// next reports: holders asking for less than their assignments are counted at their
// demand with a Poisson margin over the sum, never more than their worst (their tokens
// and a period of refill); a holder whose demand is not measured yet, or that asks for
// all it can, is counted at its worst; a late one by its refill since its report.
func TestAheadPlausible(t *testing.T) {
	const period, last = 5.0, 100.0 // seconds: the holders' reporting period, their last report
	// A holder of a client spread thin: a burst of 8, refill counted at 1.25 requests a
	// second, 5 requests a period asked for.
	spread := func(use float64) contribution {
		r := 1.25
		return contribution{open: 1, demand: 1, tok: 8, rate: r, rateAt: r * last, rateH: r * period, use: use}
	}
	var k keyState
	for range 19 {
		k.add(spread(5), 1)
	}
	t0 := last + 2.5
	worst := 19 * (8 + 1.25*period)
	want := 95 + plausibleZ*math.Sqrt(95)
	if got := k.ahead(t0); math.Abs(got-want) > 1e-9 || got >= worst {
		t.Errorf("19 holders asking 5 each: ahead %.2f, want %.2f (worst %.2f)", got, want, worst)
	}
	// One holder not measured yet counts its worst.
	k.add(spread(8+1.25*period), 1)
	want = 95 + 8 + 1.25*period
	want += plausibleZ * math.Sqrt(want)
	if got := k.ahead(t0); math.Abs(got-want) > 1e-9 {
		t.Errorf("with an unmeasured holder: ahead %.2f, want %.2f", got, want)
	}
	// Holders asking for all they can are counted at their worst, the margin capped.
	var heavy keyState
	for range 3 {
		heavy.add(contribution{open: 1, tok: 4, rate: 2, rateAt: 2 * last, rateH: 2 * period, use: 4 + 2*period}, 1)
	}
	if got, want := heavy.ahead(t0), 3*(4+2*period); math.Abs(got-want) > 1e-9 {
		t.Errorf("holders at their rate: ahead %.2f, want their worst %.2f", got, want)
	}
	// Late by four periods (their streams being started again): their refill since.
	late := last + 4*period
	want = 20 * 1.25 * 4 * period
	want += plausibleZ * math.Sqrt(want)
	if got := k.ahead(late); math.Abs(got-want) > 1e-9 {
		t.Errorf("late holders: ahead %.2f, want %.2f", got, want)
	}
}
