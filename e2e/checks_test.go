package e2e_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/streamlimit/streamlimit/internal/testenv"
)

// reportT records what a check reports instead of failing the test that runs it.
type reportT struct {
	testing.TB
	errs []string
}

func (r *reportT) Helper() {}

func (r *reportT) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

// heavyRun is 40 s of the heavy client at 100 requests a second, answered in 2 ms, of
// which admit(sent) says which are admitted.
func heavyRun(admit func(i int, sent time.Duration) bool) []result {
	var rs []result
	for i := range 4000 {
		sent := time.Duration(i) * 10 * time.Millisecond
		rs = append(rs, result{client: heavyClient, sent: sent, recv: sent + 2*time.Millisecond, status: 200, admitted: admit(i, sent)})
	}
	return rs
}

// stallsAt is a stall meter of a run started at start that measured the given spans.
func stallsAt(start time.Time, spans ...span) stallClock {
	var ss []testenv.Stall
	for _, s := range spans {
		ss = append(ss, testenv.Stall{From: start.Add(s.from), To: start.Add(s.to)})
	}
	return stallClock{testenv.StallsOf(start, start.Add(40*time.Second), ss...), start}
}

// TestChecksSeeThroughStalls: a stall sets windows aside, never the verdict. The bound of
// TestMultiDC (limit 100 per 5 s) holds for a system that admits one request in five; a
// system that admits twice that (a broken limit) fails it with a stall and without; a
// stall over most of the run makes the check inconclusive, whatever the system did; and
// an over-admission inside a stall, where the machine explains it, is set aside.
func TestChecksSeeThroughStalls(t *testing.T) {
	start := time.Unix(1000, 0)
	good := func(i int, _ time.Duration) bool { return i%5 == 0 }
	broken := func(i int, _ time.Duration) bool { return i%5 == 0 || i%5 == 1 }
	// burst admits everything in [12 s, 13 s], the second after a stall.
	burst := func(i int, sent time.Duration) bool {
		return good(i, sent) || sent >= 12*time.Second && sent < 13*time.Second
	}
	stall := span{10 * time.Second, 12 * time.Second}
	long := span{8 * time.Second, 36 * time.Second}
	for _, c := range []struct {
		name   string
		admit  func(int, time.Duration) bool
		stalls stallClock
		want   []string // substrings of the errors, in order; none for a pass
	}{
		{"good", good, stallClock{}, nil},
		{"good, stalled", good, stallsAt(start, stall), nil},
		{"broken", broken, stallClock{}, []string{"more than limit × 1.02 + 1", "more than 1.10 × the limit"}},
		{"broken, stalled", broken, stallsAt(start, stall), []string{"more than limit × 1.02 + 1", "more than 1.10 × the limit"}},
		{"broken, stalled most of the run", broken, stallsAt(start, long), []string{"inconclusive: the machine stalled 28.0s", "more than limit × 1.02 + 1", "inconclusive", "more than 1.10 × the limit"}},
		{"good, stalled most of the run", good, stallsAt(start, long), []string{"inconclusive", "inconclusive"}},
		{"burst after a stall", burst, stallsAt(start, stall), nil},
		{"burst, no stall measured", burst, stallClock{}, []string{"more than limit × 1.02 + 1", "more than 1.10 × the limit"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			rs := heavyRun(c.admit)
			r := &reportT{TB: t}
			checkBound(r, "bound", admittedOf(rs, heavyClient), ruleLimit, ruleWindow, 2*time.Second, 40*time.Second, floorExceptions{}, c.stalls)
			checkOutage(r, "outage", admittedOf(rs, heavyClient), ruleLimit, ruleWindow, 2*time.Second, 40*time.Second, 1.1, c.stalls)
			if len(r.errs) != len(c.want) {
				t.Fatalf("errors %q, want %d matching %q", r.errs, len(c.want), c.want)
			}
			for i, w := range c.want {
				if !strings.Contains(r.errs[i], w) {
					t.Errorf("error %d: %q, want it to say %q", i, r.errs[i], w)
				}
			}
		})
	}
}

// TestCheckRTTSeesThroughStalls: a slow answer clear of any stall fails the round-trip
// bound; one in flight during a stall is set aside.
func TestCheckRTTSeesThroughStalls(t *testing.T) {
	start := time.Unix(1000, 0)
	rs := heavyRun(func(int, time.Duration) bool { return true })
	rs[1500].recv = rs[1500].sent + 8*time.Second // sent at 15 s
	for _, c := range []struct {
		name   string
		stalls stallClock
		fails  bool
	}{
		{"no stall", stallClock{}, true},
		{"stall elsewhere", stallsAt(start, span{30 * time.Second, 31 * time.Second}), true},
		{"stall while in flight", stallsAt(start, span{17 * time.Second, 19 * time.Second}), false},
	} {
		r := &reportT{TB: t}
		checkRTT(r, c.name, rs, 0, 40*time.Second, c.stalls)
		if got := len(r.errs) > 0; got != c.fails {
			t.Errorf("%s: errors %q, want failing %v", c.name, r.errs, c.fails)
		}
	}
}

// TestChecksFloorExceptions: a pipeline known to be late lowers or waives the floor of
// checkBound near it, never the safety bound, and never hides a starvation elsewhere. A
// system that admits one request in five keeps the floor (100 per 5 s window); one that
// admits none for 2 s dips to 60, under the 0.7 floor, which only sites taken as silent
// (waived) explain; one that admits one in ten (50) is starved wherever the pipeline was on
// time; one that admits two in five breaks the safety bound however late the pipeline was.
func TestChecksFloorExceptions(t *testing.T) {
	good := func(i int, _ time.Duration) bool { return i%5 == 0 }
	dip := func(i int, sent time.Duration) bool {
		return good(i, sent) && (sent < 20*time.Second || sent >= 22*time.Second)
	}
	starved := func(i int, _ time.Duration) bool { return i%10 == 0 }
	broken := func(i int, _ time.Duration) bool { return i%5 == 0 || i%5 == 1 }
	late := []span{{19 * time.Second, 23 * time.Second}}
	lateMost := []span{{5 * time.Second, 38 * time.Second}}
	for _, c := range []struct {
		name  string
		admit func(int, time.Duration) bool
		ex    floorExceptions
		want  []string // substrings of the errors, in order; none for a pass
	}{
		{"good", good, floorExceptions{}, nil},
		{"dip, pipeline on time", dip, floorExceptions{}, []string{"less than 0.85 × limit"}},
		{"dip, pipeline late", dip, floorExceptions{lowered: late}, []string{"less than 0.7 × limit"}},
		{"dip, sites taken as silent", dip, floorExceptions{lowered: late, waived: late}, nil},
		{"starved, pipeline late near the dip", starved, floorExceptions{lowered: late, waived: late}, []string{"less than 0.7 × limit", "less than 0.85 × limit"}},
		{"broken, sites taken as silent most of the run", broken, floorExceptions{lowered: lateMost, waived: lateMost}, []string{"inconclusive: the pipeline lagged", "more than limit × 1.02 + 1"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := &reportT{TB: t}
			checkBound(r, "bound", admittedOf(heavyRun(c.admit), heavyClient), ruleLimit, ruleWindow, 2*time.Second, 40*time.Second, c.ex, stallClock{})
			if len(r.errs) != len(c.want) {
				t.Fatalf("errors %q, want %d matching %q", r.errs, len(c.want), c.want)
			}
			for i, w := range c.want {
				if !strings.Contains(r.errs[i], w) {
					t.Errorf("error %d: %q, want it to say %q", i, r.errs[i], w)
				}
			}
		})
	}
}

// TestCheckColdSeesThroughStalls: the cold check holds each new key to its bound in every
// phase that stalls left measurable, so one stall early in the run no longer leaves
// nothing to measure; only when every phase is stalled is it inconclusive.
func TestCheckColdSeesThroughStalls(t *testing.T) {
	start := time.Unix(1000, 0)
	phases := []burst{
		{client: heavyClient, from: 0, to: coldSpan},
		{client: "cold-1", from: coldSpan, to: 2 * coldSpan},
		{client: "cold-2", from: 2 * coldSpan, to: 3 * coldSpan},
	}
	// run is every phase's key at 100 requests a second over its span, of which one in
	// five is admitted (20 per second: the limit of 100 per 5 s), or two in five for the
	// keys named in broken.
	run := func(broken ...string) []result {
		var rs []result
		for _, p := range phases {
			for i := 0; time.Duration(i)*10*time.Millisecond < p.to-p.from; i++ {
				sent := p.from + time.Duration(i)*10*time.Millisecond
				admit := i%5 == 0 || i%5 == 1 && slices.Contains(broken, p.client)
				rs = append(rs, result{client: p.client, sent: sent, recv: sent + 2*time.Millisecond, status: 200, admitted: admit})
			}
		}
		return rs
	}
	early := span{1 * time.Second, 1300 * time.Millisecond}
	for _, c := range []struct {
		name   string
		rs     []result
		stalls stallClock
		want   []string
	}{
		{"good", run(), stallClock{}, nil},
		{"every key broken", run(heavyClient, "cold-1", "cold-2"), stallClock{}, []string{"heavy:", "cold-1:", "cold-2:"}},
		{"an early stall sets the first phase aside", run(heavyClient), stallsAt(start, early), nil},
		{"an early stall, a later key broken", run("cold-2"), stallsAt(start, early), []string{"cold-2:"}},
		{"every phase stalled", run(), stallsAt(start, early, span{14 * time.Second, 14300 * time.Millisecond}, span{26 * time.Second, 26300 * time.Millisecond}), []string{"inconclusive"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := &reportT{TB: t}
			checkCold(r, "cold", c.rs, phases, 1.25, c.stalls)
			if len(r.errs) != len(c.want) {
				t.Fatalf("errors %q, want %d matching %q", r.errs, len(c.want), c.want)
			}
			for i, w := range c.want {
				if !strings.Contains(r.errs[i], w) {
					t.Errorf("error %d: %q, want it to say %q", i, r.errs[i], w)
				}
			}
		})
	}
}
