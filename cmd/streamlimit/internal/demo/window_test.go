package demo

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// bruteStats samples every millisecond of [from, to]: the reference for windowStats when
// admissions are whole milliseconds.
func bruteStats(at []time.Duration, w, from, to time.Duration) (maxCount int, mean float64) {
	var sum float64
	n := 0
	for t := from; t < to; t += time.Millisecond {
		c := 0
		for _, a := range at {
			if a > t-w && a <= t {
				c++
			}
		}
		maxCount = max(maxCount, c)
		sum += float64(c)
		n++
	}
	return maxCount, sum / float64(n)
}

func TestWindowStatsMatchesBruteForce(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for trial := range 20 {
		var at []time.Duration
		for range r.IntN(200) {
			at = append(at, time.Duration(r.IntN(3000))*time.Millisecond)
		}
		w, from, to := 500*time.Millisecond, 500*time.Millisecond, 3000*time.Millisecond
		wantMax, wantMean := bruteStats(at, w, from, to)
		got := windowStats(append([]time.Duration(nil), at...), w, from, to)
		if got.Max != wantMax {
			t.Errorf("trial %d: max %d, brute force %d", trial, got.Max, wantMax)
		}
		if math.Abs(got.Mean-wantMean) > 1e-9 {
			t.Errorf("trial %d: mean %v, brute force %v", trial, got.Mean, wantMean)
		}
		if c := countIn(at, got.MaxAt-w, got.MaxAt); c != got.Max {
			t.Errorf("trial %d: window ending at %v holds %d, not max %d", trial, got.MaxAt, c, got.Max)
		}
	}
}

func countIn(at []time.Duration, lo, hi time.Duration) int {
	c := 0
	for _, a := range at {
		if a > lo && a <= hi {
			c++
		}
	}
	return c
}

func TestWindowStatsEdges(t *testing.T) {
	s := time.Second
	// A window is (t−w, t]: admissions exactly w apart are never in one window.
	got := windowStats([]time.Duration{1 * s, 2 * s, 3 * s}, s, s, 3*s)
	if got.Max != 1 || got.Mean != 1 {
		t.Fatalf("spaced admissions: %+v", got)
	}
	if st := windowStats(nil, s, 2*s, s); st.Measured() || st.Max != 0 {
		t.Fatalf("empty interval: %+v", st)
	}
}

// TestLiveRedraw checks that the live view moves the cursor back over its previous table
// and that the plain view writes no escape sequences.
func TestLiveRedraw(t *testing.T) {
	rcfg, err := LoadRules()
	if err != nil {
		t.Fatal(err)
	}
	p, err := newPlan(rcfg, Options{Duration: 10 * time.Second, Sites: 3})
	if err != nil {
		t.Fatal(err)
	}
	st := status{at: 3 * time.Second, inWindow: 42, byClient: make([][2]int64, len(p.clients)),
		sites: []siteStatus{{name: "eu", admitted: 5}, {name: "us"}, {name: "ap", stale: true}}}
	var live, plain strings.Builder
	m := &monitor{p: p, opts: Options{Live: true, Duration: 10 * time.Second}, w: &live}
	m.write(st)
	first := live.Len()
	m.write(st)
	n := len(m.table(st))
	if !strings.HasPrefix(live.String()[first:], fmt.Sprintf("\x1b[%dA", n)) {
		t.Fatalf("second table does not move up %d lines: %q", n, live.String()[first:first+10])
	}
	if !strings.Contains(live.String(), "42 admitted in the last 5s") || !strings.Contains(live.String(), "STALE") {
		t.Fatalf("live table:\n%s", live.String())
	}
	(&monitor{p: p, opts: Options{Duration: 10 * time.Second}, w: &plain}).write(st)
	if strings.Contains(plain.String(), "\x1b") || !strings.Contains(plain.String(), "mallory: 42 admitted") {
		t.Fatalf("plain line: %q", plain.String())
	}
}
