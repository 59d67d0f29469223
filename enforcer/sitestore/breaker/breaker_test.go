package breaker

import (
	"slices"
	"testing"
	"time"

	"github.com/streamlimit/streamlimit/clock"
)

func allowed(b *Breaker) bool {
	ok, _ := b.Allow()
	return ok
}

// TestSporadicFailuresUnderLoadKeepItClosed: a busy dependency whose slowest calls now and
// then fail (one in 50) never opens the breaker, however many failures that adds up to.
func TestSporadicFailuresUnderLoadKeepItClosed(t *testing.T) {
	clk := clock.NewFake(time.Unix(1000, 0))
	b := New(Options{Clock: clk})
	for i := range 100_000 {
		if !allowed(b) {
			t.Fatalf("call %d refused: state %v", i, b.State())
		}
		if i%50 == 0 {
			b.Failure()
		} else {
			b.Success()
		}
		clk.Advance(100 * time.Microsecond)
	}
	if b.State() != Closed {
		t.Fatalf("state = %v, want closed", b.State())
	}
}

// TestErrorRateOpens: once MinFailures failures are ErrorRate of the window's calls, it
// opens; fewer failures, or a lower rate, do not.
func TestErrorRateOpens(t *testing.T) {
	clk := clock.NewFake(time.Unix(1000, 0))
	b := New(Options{Clock: clk, MinFailures: 4, ErrorRate: 0.5, Window: time.Second})
	for range 6 {
		allowed(b)
		b.Success()
	}
	for i := range 5 {
		allowed(b)
		b.Failure()
		if b.State() != Closed {
			t.Fatalf("opened after %d failures in 6+%d calls (rate under 0.5)", i+1, i+1)
		}
	}
	allowed(b)
	b.Failure() // 6 of 12
	if b.State() != Open {
		t.Fatalf("state after 6 failures of 12 calls = %v, want open", b.State())
	}
}

// TestOldFailuresLeaveTheWindow: failures older than Window no longer count (Silence, which
// would open it on a dependency that answers nothing for long, is set out of the way).
func TestOldFailuresLeaveTheWindow(t *testing.T) {
	clk := clock.NewFake(time.Unix(1000, 0))
	b := New(Options{Clock: clk, MinFailures: 3, Window: time.Second, Silence: time.Hour})
	for range 2 {
		allowed(b)
		b.Failure()
	}
	clk.Advance(1100 * time.Millisecond)
	allowed(b)
	b.Failure()
	if b.State() != Closed {
		t.Fatalf("state = %v: failures from before the window counted", b.State())
	}
	allowed(b)
	b.Failure()
	allowed(b)
	b.Failure()
	if b.State() != Open {
		t.Fatalf("state after 3 failures within the window = %v, want open", b.State())
	}
}

// TestProbesAndRecovery: open refuses until the probe interval; half-open lets one probe
// at a time; a failed probe reopens for a full interval; ProbeSuccesses successful probes
// close it.
func TestProbesAndRecovery(t *testing.T) {
	clk := clock.NewFake(time.Unix(1000, 0))
	var changes []State
	b := New(Options{MinFailures: 1, ProbeSuccesses: 2, ProbeInterval: time.Second, Clock: clk,
		OnStateChange: func(s State) { changes = append(changes, s) }})
	allowed(b)
	b.Failure()
	if b.State() != Open || allowed(b) {
		t.Fatalf("state = %v, want open and refusing", b.State())
	}
	clk.Advance(999 * time.Millisecond)
	if allowed(b) {
		t.Fatal("open breaker let a call through 1 ms before the probe interval")
	}
	clk.Advance(time.Millisecond)
	if ok, probe := b.Allow(); !ok || !probe {
		t.Fatalf("Allow after the interval = %v, %v, want a probe", ok, probe)
	}
	if allowed(b) {
		t.Fatal("half-open breaker let a second call through while probing")
	}
	b.Failure()
	if b.State() != Open {
		t.Fatalf("state after failed probe = %v, want open", b.State())
	}
	clk.Advance(500 * time.Millisecond)
	if allowed(b) {
		t.Fatal("reopened breaker let a call through early")
	}
	clk.Advance(500 * time.Millisecond)
	if ok, probe := b.Allow(); !ok || !probe {
		t.Fatal("no second probe")
	}
	b.Success()
	if b.State() != HalfOpen {
		t.Fatalf("state after 1 of 2 successful probes = %v, want half-open", b.State())
	}
	if ok, probe := b.Allow(); !ok || !probe {
		t.Fatal("no next probe after a successful one")
	}
	b.Success()
	if b.State() != Closed {
		t.Fatalf("state after 2 successful probes = %v, want closed", b.State())
	}
	if ok, probe := b.Allow(); !ok || probe {
		t.Fatalf("closed Allow = %v, %v, want an ordinary call", ok, probe)
	}
	if want := []State{Open, HalfOpen, Open, HalfOpen, Closed}; !slices.Equal(changes, want) {
		t.Fatalf("transitions = %v, want %v", changes, want)
	}
}

// TestLostAndCanceledProbes: a probe never reported is replaced after the interval; a
// canceled one at once.
func TestLostAndCanceledProbes(t *testing.T) {
	clk := clock.NewFake(time.Unix(0, 0))
	b := New(Options{MinFailures: 1, ProbeInterval: time.Second, Clock: clk})
	allowed(b)
	b.Failure()
	clk.Advance(time.Second)
	if !allowed(b) {
		t.Fatal("no probe")
	}
	clk.Advance(time.Second)
	if !allowed(b) {
		t.Fatal("a lost probe wedged the breaker")
	}
	b.Cancel()
	if !allowed(b) {
		t.Fatal("a canceled probe did not free its place")
	}
	if b.State() != HalfOpen {
		t.Fatalf("state = %v, want half-open", b.State())
	}
}

// TestSilenceOpens: a dependency that stops answering after a busy spell opens the breaker
// once it has answered nothing for Silence (with MinFailures failures since), although the
// window's earlier successes keep the error rate far below ErrorRate; failures with
// successes between them, or a silence shorter than Silence, do not.
func TestSilenceOpens(t *testing.T) {
	clk := clock.NewFake(time.Unix(1000, 0))
	b := New(Options{Clock: clk})
	busy := func() {
		for range 10_000 {
			allowed(b)
			b.Success()
			clk.Advance(100 * time.Microsecond)
		}
	}
	busy()
	// A spell of 300 ms in which 32 calls time out, then answers again: closed.
	clk.Advance(300 * time.Millisecond)
	for range 32 {
		allowed(b)
		b.Failure()
	}
	if b.State() != Closed {
		t.Fatalf("a 300 ms spell opened the breaker (Silence %v)", DefaultSilence)
	}
	busy()
	// Every call fails from here on: 32 callers, each call timing out after 250 ms.
	var opened time.Duration
	for step := time.Duration(0); step <= 2*time.Second; step += 250 * time.Millisecond {
		for range 32 {
			if allowed(b) {
				b.Failure()
			}
		}
		if b.State() != Closed {
			opened = step
			break
		}
		clk.Advance(250 * time.Millisecond)
	}
	if b.State() != Open || opened != 500*time.Millisecond {
		t.Fatalf("state %v after failures for %v; want open at %v", b.State(), opened, DefaultSilence)
	}
}
