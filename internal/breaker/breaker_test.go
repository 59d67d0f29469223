package breaker

import (
	"testing"
	"time"

	"github.com/streamlimit/streamlimit/internal/clock"
)

func TestThresholdProbeAndRecovery(t *testing.T) {
	clk := clock.NewFake(time.Unix(1000, 0))
	var changes []State
	b := New(Options{FailureThreshold: 3, ProbeInterval: time.Second, Clock: clk, OnStateChange: func(s State) { changes = append(changes, s) }})

	for i := 0; i < 2; i++ {
		if !b.Allow() {
			t.Fatalf("closed breaker refused call %d", i)
		}
		b.Failure(false)
	}
	b.Success() // a success in between resets the count
	for i := 0; i < 2; i++ {
		b.Allow()
		b.Failure(false)
	}
	if b.State() != Closed {
		t.Fatalf("state after 2 consecutive failures = %v, want closed", b.State())
	}
	b.Allow()
	b.Failure(false)
	if b.State() != Open {
		t.Fatalf("state after 3 consecutive failures = %v, want open", b.State())
	}
	if b.Allow() {
		t.Fatal("open breaker let a call through before the probe interval")
	}
	clk.Advance(999 * time.Millisecond)
	if b.Allow() {
		t.Fatal("open breaker let a call through 1 ns before the probe interval")
	}
	clk.Advance(time.Millisecond)
	if !b.Allow() {
		t.Fatal("no probe after the probe interval")
	}
	if b.State() != HalfOpen {
		t.Fatalf("state while probing = %v, want half-open", b.State())
	}
	if b.Allow() {
		t.Fatal("half-open breaker let a second call through")
	}
	b.Failure(false) // failed probe: open again for a full interval
	if b.State() != Open {
		t.Fatalf("state after failed probe = %v, want open", b.State())
	}
	clk.Advance(500 * time.Millisecond)
	if b.Allow() {
		t.Fatal("reopened breaker let a call through early")
	}
	clk.Advance(500 * time.Millisecond)
	if !b.Allow() {
		t.Fatal("no second probe")
	}
	b.Success()
	if b.State() != Closed || !b.Allow() {
		t.Fatalf("state after successful probe = %v, want closed", b.State())
	}
	want := []State{Open, HalfOpen, Open, HalfOpen, Closed}
	if len(changes) != len(want) {
		t.Fatalf("transitions = %v, want %v", changes, want)
	}
	for i := range want {
		if changes[i] != want[i] {
			t.Fatalf("transitions = %v, want %v", changes, want)
		}
	}
}

func TestTripOpensAtOnce(t *testing.T) {
	clk := clock.NewFake(time.Unix(0, 0))
	b := New(Options{Clock: clk})
	b.Allow()
	b.Failure(true)
	if b.State() != Open || b.Allow() {
		t.Fatalf("state after a trip = %v, want open and refusing", b.State())
	}
}

func TestLostProbeIsReplaced(t *testing.T) {
	clk := clock.NewFake(time.Unix(0, 0))
	b := New(Options{FailureThreshold: 1, ProbeInterval: time.Second, Clock: clk})
	b.Allow()
	b.Failure(false)
	clk.Advance(time.Second)
	if !b.Allow() {
		t.Fatal("no probe")
	}
	// The probe's outcome is never reported.
	clk.Advance(time.Second)
	if !b.Allow() {
		t.Fatal("a lost probe wedged the breaker")
	}
}
