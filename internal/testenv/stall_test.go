package testenv

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// errorsT records what a check reports instead of failing the test that runs it.
type errorsT struct {
	testing.TB
	errs []string
}

func (e *errorsT) Helper() {}

func (e *errorsT) Errorf(format string, args ...any) {
	e.errs = append(e.errs, fmt.Sprintf(format, args...))
}

// TestStallsRecord feeds the meter ticks by hand: on time, within the noise, and two
// stalls, and checks what it reports of them.
func TestStallsRecord(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	s := newStalls(t0, StallTick, StallNoise)
	s.record(at(10), at(11))    // on time
	s.record(at(21), at(40))    // 19 ms late: noise
	s.record(at(50), at(350))   // a 300 ms stall
	s.record(at(360), at(361))  // on time
	s.record(at(900), at(2900)) // a 2 s stall
	s.mu.Lock()
	s.end = at(10_000)
	s.mu.Unlock()

	if got := s.Spans(0); len(got) != 2 || got[0].Duration() != 300*time.Millisecond || got[1].Duration() != 2*time.Second {
		t.Fatalf("Spans(0) = %v, want the 300 ms and the 2 s stall", got)
	}
	if got := s.Spans(500 * time.Millisecond); len(got) != 1 {
		t.Errorf("Spans(500ms) = %v, want the 2 s stall alone", got)
	}
	for _, c := range []struct {
		from, to int
		min      time.Duration
		want     bool
	}{
		{0, 49, 0, false},
		{0, 51, 0, true},
		{400, 899, 0, false},
		{100, 200, 0, true},                        // inside the first stall
		{100, 200, 500 * time.Millisecond, false},  // which is shorter than min
		{2800, 5000, 500 * time.Millisecond, true}, // the end of the second
		{2900, 5000, 0, false},
	} {
		if got := s.Overlaps(at(c.from), at(c.to), c.min); got != c.want {
			t.Errorf("Overlaps(%d ms, %d ms, %v) = %v, want %v", c.from, c.to, c.min, got, c.want)
		}
	}
	all := s.Summary(time.Time{}, time.Time{}, 0)
	if all.Span != 10*time.Second || all.Stalled != 2300*time.Millisecond || all.Count != 2 || all.Worst != 2*time.Second {
		t.Errorf("Summary of the whole run = %+v", all)
	}
	if m := all.Measurable(); m < 0.769 || m > 0.771 {
		t.Errorf("Measurable = %v, want 0.77", m)
	}
	// A span that cuts the second stall counts only the part inside it, and its worst.
	part := s.Summary(at(2000), at(4000), 0)
	if part.Stalled != 900*time.Millisecond || part.Count != 1 || part.Worst != 2*time.Second {
		t.Errorf("Summary of [2 s, 4 s] = %+v", part)
	}
	t.Logf("%s", all)
}

// TestStallsInconclusive: a check that kept too few units fails as inconclusive, naming
// the stall; one that kept enough is left to its own verdict.
func TestStallsInconclusive(t *testing.T) {
	t0 := time.Unix(1000, 0)
	s := newStalls(t0, StallTick, StallNoise)
	s.record(t0.Add(time.Second), t0.Add(4*time.Second))
	s.mu.Lock()
	s.end = t0.Add(10 * time.Second)
	s.mu.Unlock()

	var e errorsT
	if s.Inconclusive(&e, "bound", 60, 100, t0, t0.Add(10*time.Second), 0) || len(e.errs) != 0 {
		t.Errorf("60 of 100 kept: inconclusive (%q)", e.errs)
	}
	if !s.Inconclusive(&e, "bound", 40, 100, t0, t0.Add(10*time.Second), 0) || len(e.errs) != 1 ||
		!strings.Contains(e.errs[0], "inconclusive: the machine stalled 3.0s (worst 3s)") {
		t.Errorf("40 of 100 kept: %q, want an inconclusive failure naming the stall", e.errs)
	}
	if !s.Inconclusive(&e, "bound", 0, 0, t0, t0.Add(10*time.Second), 0) {
		t.Error("nothing to measure: not inconclusive")
	}
}

// TestStallsRuns starts a real meter and stops it: it measures from its start to its stop.
func TestStallsRuns(t *testing.T) {
	s := StartStalls(t)
	time.Sleep(50 * time.Millisecond)
	s.Stop()
	s.Stop()
	m := s.Summary(time.Time{}, time.Time{}, 0)
	if m.Span < 50*time.Millisecond || m.Stalled > m.Span {
		t.Errorf("summary %+v", m)
	}
}
