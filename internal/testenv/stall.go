package testenv

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"
)

// Stall meter defaults.
const (
	// StallTick is how often the meter's timer is due.
	StallTick = 10 * time.Millisecond
	// StallNoise is the lateness below which a tick counts as on time: the scheduler's
	// and the timer's own jitter on an idle machine.
	StallNoise = 20 * time.Millisecond
	// MinMeasurable is the least fraction of a check's units (windows, requests) that must
	// be left once those overlapping a stall are set aside, for the check to say anything.
	MinMeasurable = 0.5
)

// Stall is a span in which the meter's timer did not fire on time: the test process, its
// goroutines and the clients and servers it runs in process, did not run when due (the
// machine was busy, the process paused). From is when the tick was due, To when it fired.
type Stall struct{ From, To time.Time }

// Duration is how late the tick fired.
func (s Stall) Duration() time.Duration { return s.To.Sub(s.From) }

// Stalls is a stall meter: a goroutine whose timer is due every StallTick records every
// tick that fires more than StallNoise late. A real-time test starts one first and asks
// it, before holding the system to a bound over a span of time, whether the machine
// stalled in that span: the bound is checked on the spans that were not stalled, and the
// test fails as inconclusive (Inconclusive) when too few were left, rather than with a
// figure the stall made wrong.
//
// A Stalls is safe for use by multiple goroutines.
type Stalls struct {
	tick, noise time.Duration
	start       time.Time
	quit        chan struct{}
	done        chan struct{}
	stopOnce    sync.Once

	mu     sync.Mutex
	stalls []Stall
	end    time.Time // when Stop was called; zero while running
}

// StartStalls starts a stall meter that runs until Stop or the end of the test, when it
// logs a FIGURE line with what it measured.
func StartStalls(t testing.TB) *Stalls {
	t.Helper()
	s := newStalls(time.Now(), StallTick, StallNoise)
	go s.run()
	t.Cleanup(func() {
		s.Stop()
		t.Logf("FIGURE stalls: %s", s.Summary(time.Time{}, time.Time{}, 0))
	})
	return s
}

// StallsOf returns a stopped meter that measured the given stalls between start and end,
// for tests of the checks that read one.
func StallsOf(start, end time.Time, stalls ...Stall) *Stalls {
	s := newStalls(start, StallTick, StallNoise)
	s.stopOnce.Do(func() {})
	s.stalls = append(s.stalls, stalls...)
	s.end = end
	return s
}

// StartServiceStalls starts a stall meter of a service the test runs against (Redis, a
// broker): every StallTick it calls probe, a request the service answers at once when it
// runs (PING), and records every call that takes more than noise as a stall of the service
// from the call to its answer. A service stalls on a busy machine where the test process
// does not: a server process gets its share of the cores, not the share its clients'
// requests need. noise is above what the test itself makes the service do between two
// probes. It runs until Stop or the end of the test, and logs a FIGURE line named name.
func StartServiceStalls(t testing.TB, name string, noise time.Duration, probe func(context.Context) error) *Stalls {
	t.Helper()
	s := newStalls(time.Now(), StallTick, noise)
	go func() {
		defer close(s.done)
		for {
			select {
			case <-s.quit:
				return
			case <-time.After(s.tick):
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			from := time.Now()
			_ = probe(ctx) // a probe that fails late is as late as one that answers late
			cancel()
			s.record(from, time.Now())
		}
	}()
	t.Cleanup(func() {
		s.Stop()
		t.Logf("FIGURE stalls of %s: %s", name, s.Summary(time.Time{}, time.Time{}, 0))
	})
	return s
}

func newStalls(start time.Time, tick, noise time.Duration) *Stalls {
	return &Stalls{tick: tick, noise: noise, start: start, quit: make(chan struct{}), done: make(chan struct{})}
}

func (s *Stalls) run() {
	defer close(s.done)
	due := s.start.Add(s.tick)
	tm := time.NewTimer(s.tick)
	defer tm.Stop()
	for {
		select {
		case <-s.quit:
			return
		case <-tm.C:
		}
		now := time.Now()
		s.record(due, now)
		// The next tick is due a tick after this one fired, not on the original grid: a
		// stall is counted once, not again as every tick it swallowed.
		due = now.Add(s.tick)
		tm.Reset(s.tick)
	}
}

// record notes a tick due at due that fired at fired.
func (s *Stalls) record(due, fired time.Time) {
	if fired.Sub(due) <= s.noise {
		return
	}
	s.mu.Lock()
	s.stalls = append(s.stalls, Stall{From: due, To: fired})
	s.mu.Unlock()
}

// Stop ends the measurement; it may be called more than once.
func (s *Stalls) Stop() {
	s.stopOnce.Do(func() {
		close(s.quit)
		<-s.done
		s.mu.Lock()
		s.end = time.Now()
		s.mu.Unlock()
	})
}

// Start is when the meter started.
func (s *Stalls) Start() time.Time { return s.start }

// Spans returns the stalls longer than min so far, in time order.
func (s *Stalls) Spans(min time.Duration) []Stall {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Stall
	for _, st := range s.stalls {
		if st.Duration() > min {
			out = append(out, st)
		}
	}
	return out
}

// Overlaps reports whether a stall longer than min overlaps [from, to].
func (s *Stalls) Overlaps(from, to time.Time, min time.Duration) bool {
	for _, st := range s.Spans(min) {
		if st.From.Before(to) && st.To.After(from) {
			return true
		}
	}
	return false
}

// StallSummary is what a meter measured over a span of time.
type StallSummary struct {
	// Span is the time measured: the span asked about, cut to when the meter ran.
	Span time.Duration
	// Stalled is the time within Span in stalls longer than the minimum asked about;
	// Count how many there were and Worst the longest (whole, not cut to Span).
	Stalled time.Duration
	Count   int
	Worst   time.Duration
}

// Measurable is the fraction of Span not stalled.
func (m StallSummary) Measurable() float64 {
	if m.Span <= 0 {
		return 0
	}
	return 1 - float64(m.Stalled)/float64(m.Span)
}

func (m StallSummary) String() string {
	return fmt.Sprintf("stalled %.2fs in %d stalls (worst %v) of %.1fs: %.1f%% measurable",
		m.Stalled.Seconds(), m.Count, m.Worst.Round(time.Millisecond), m.Span.Seconds(), 100*m.Measurable())
}

// Summary sums the stalls longer than min within [from, to]; a zero from or to stands for
// the start of the meter or now (or when it stopped).
func (s *Stalls) Summary(from, to time.Time, min time.Duration) StallSummary {
	s.mu.Lock()
	end := s.end
	s.mu.Unlock()
	if end.IsZero() {
		end = time.Now()
	}
	if from.IsZero() || from.Before(s.start) {
		from = s.start
	}
	if to.IsZero() || to.After(end) {
		to = end
	}
	var m StallSummary
	if !to.After(from) {
		return m
	}
	m.Span = to.Sub(from)
	for _, st := range s.Spans(min) {
		a, b := maxTime(st.From, from), minTime(st.To, to)
		if !b.After(a) {
			continue
		}
		m.Count++
		m.Stalled += b.Sub(a)
		m.Worst = max(m.Worst, st.Duration())
	}
	return m
}

// Inconclusive fails t as inconclusive, and returns true, when fewer than MinMeasurable of
// a check's total units (windows of a sliding-window bound, requests of a round-trip
// bound) were kept once those overlapping a stall longer than min in [from, to] were set
// aside (a zero from or to as for Summary). The caller still holds the kept units to its
// bound: a stall makes a check say less, never pass.
func (s *Stalls) Inconclusive(t testing.TB, what string, kept, total int, from, to time.Time, min time.Duration) bool {
	t.Helper()
	if total > 0 && float64(kept) >= MinMeasurable*float64(total) {
		return false
	}
	m := s.Summary(from, to, min)
	if from.IsZero() {
		from = s.start
	}
	if to.IsZero() {
		to = from.Add(m.Span)
	}
	t.Errorf("%s: inconclusive: the machine stalled %.1fs (worst %v) in [%.1fs, %.1fs]: %d of %d measurable, fewer than %.0f%%",
		what, m.Stalled.Seconds(), m.Worst.Round(time.Millisecond), from.Sub(s.start).Seconds(), to.Sub(s.start).Seconds(),
		kept, total, 100*MinMeasurable)
	return true
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
