package enforcer

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/streamlimit/streamlimit/enforcer/rules"
	"github.com/streamlimit/streamlimit/internal/clock"
)

const shapingRules = `
domain: api
descriptors:
  - key: job
    rate_limit: {unit: second, requests_per_unit: 2, scope: local, algorithm: leaky_bucket, burst: 3}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 5}
`

func TestReserveQueuesAtTheLeakRate(t *testing.T) {
	l, _ := newLimiter(t, shapingRules, nil)
	ctx := context.Background()
	req := Request{Domain: "api", Descriptors: [][]rules.Entry{desc("job", "export")}}
	// 2 per second, a queue of 3: the first goes now, the next ones every 500 ms, as long
	// as the wait stays within 1.2 s; a denied one takes nothing.
	var delays []time.Duration
	for range 4 {
		d, res, err := l.Reserve(ctx, req, 1200*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if res.Code != CodeOK {
			delays = append(delays, -1)
			continue
		}
		delays = append(delays, d)
	}
	want := []time.Duration{0, 500 * time.Millisecond, time.Second, -1}
	for i := range want {
		if delays[i] != want[i] {
			t.Fatalf("delays %v, want %v", delays, want)
		}
	}
	_, res, _ := l.Reserve(ctx, req, 1200*time.Millisecond)
	if res.Code != CodeOverLimit || res.Statuses[0].RetryAfter <= 0 {
		t.Fatalf("queue still full: %+v", res.Statuses[0])
	}
}

func TestReserveRefusesNonLocalLimits(t *testing.T) {
	l, _ := newLimiter(t, shapingRules, nil)
	_, _, err := l.Reserve(context.Background(), Request{Domain: "api", Descriptors: [][]rules.Entry{desc("user", "1")}}, time.Second)
	if !errors.Is(err, ErrNotShapeable) {
		t.Fatalf("global limit: %v, want ErrNotShapeable", err)
	}
	_, _, err = l.Reserve(context.Background(), Request{Domain: "api", Descriptors: [][]rules.Entry{desc("nothing", "1")}}, time.Second)
	if !errors.Is(err, ErrNotShapeable) {
		t.Fatalf("no limit: %v, want ErrNotShapeable", err)
	}
}

func TestWaitSleepsTheDelay(t *testing.T) {
	// Wait sleeps on a real timer, but the delay is reserved on the limiter's clock. A
	// stopped fake clock makes that delay exactly 50 ms however long the machine takes
	// between the two calls (on the wall clock, a pause of 50 ms between them would drain
	// the queue and leave nothing to wait for). A timer never fires early, so the second
	// Wait takes at least the delay.
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	l, err := New(Config{Clock: clk, Rules: StaticRules(loadRules(t, `
domain: api
descriptors:
  - key: job
    rate_limit: {unit: second, requests_per_unit: 20, scope: local, algorithm: leaky_bucket, burst: 2}
`)), Site: "eu"})
	if err != nil {
		t.Fatal(err)
	}
	req := Request{Domain: "api", Descriptors: [][]rules.Entry{desc("job", "x")}}
	ctx := context.Background()
	if _, err := l.Wait(ctx, req, time.Second); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	res, err := l.Wait(ctx, req, time.Second)
	if err != nil || res.Code != CodeOK {
		t.Fatalf("second Wait: %+v, %v", res, err)
	}
	if waited := time.Since(start); waited < 50*time.Millisecond {
		t.Fatalf("second Wait returned after %v, want at least its 50 ms delay: it did not queue", waited)
	}
	// A cancelled context ends the wait with its error. The clock moves by the 50 ms
	// slept, as the wall clock did, so that the next one queues rather than overflows.
	clk.Advance(50 * time.Millisecond)
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := l.Wait(cctx, req, time.Second); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Wait: %v", err)
	}
}
