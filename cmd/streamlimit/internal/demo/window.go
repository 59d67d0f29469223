package demo

import (
	"slices"
	"sort"
	"time"
)

// WindowStats describes a client's admitted requests over every sliding window (t−W, t] of
// one length W whose end t lies in a measured interval [From, To] of the run.
type WindowStats struct {
	// Window is W.
	Window time.Duration
	// From and To bound the window ends measured, as offsets from the start of traffic.
	// From is one window after the start, so that every measured window lies wholly
	// inside the run.
	From, To time.Duration
	// Max is the largest number of admissions in any one window, exact: every window end
	// in [From, To] is considered, not a sample.
	Max int
	// MaxAt is the end of a window that holds Max admissions, as an offset from the start.
	MaxAt time.Duration
	// Mean is the time average of the window count over the window ends in [From, To].
	Mean float64
}

// Measured reports whether any window was measured: the run lasted longer than one window.
func (w WindowStats) Measured() bool { return w.To > w.From }

// windowStats computes WindowStats exactly from admission times (offsets from the start of
// traffic, in any order; at is sorted in place) for windows of length w ending in
// [from, to]. A window ending at t holds the admissions a with t−w < a ≤ t.
//
// The count, as a function of t, is a step function that rises only at admission times
// and falls at a+w, so its maximum over [from, to] is reached at from or at an admission
// time in [from, to]; its integral is the sum over admissions of the length of
// [a, a+w) ∩ [from, to].
func windowStats(at []time.Duration, w, from, to time.Duration) WindowStats {
	st := WindowStats{Window: w, From: from, To: to}
	if to <= from || w <= 0 {
		return st
	}
	slices.Sort(at)
	upper := func(x time.Duration) int { // admissions at or before x
		return sort.Search(len(at), func(i int) bool { return at[i] > x })
	}
	count := func(t time.Duration) int { return upper(t) - upper(t-w) }
	st.Max, st.MaxAt = count(from), from
	for _, a := range at {
		if a < from || a > to {
			continue
		}
		if c := count(a); c > st.Max {
			st.Max, st.MaxAt = c, a
		}
	}
	var area time.Duration
	for _, a := range at {
		lo, hi := max(a, from), min(a+w, to)
		if hi > lo {
			area += hi - lo
		}
	}
	st.Mean = float64(area) / float64(to-from)
	return st
}
