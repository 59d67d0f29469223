package enforcer

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/streamlimit/streamlimit/clock"
	"github.com/streamlimit/streamlimit/enforcer/rules"
)

// fakeSleep advances clk by d instead of waiting, and counts the sleeps.
type fakeSleep struct {
	clk *clock.Fake
	mu  sync.Mutex
	n   int
}

func (f *fakeSleep) sleep(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	f.mu.Lock()
	f.n++
	f.mu.Unlock()
	f.clk.Advance(d)
	return nil
}

const awaitRules = `
domain: api
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: ip
    rate_limit: {unit: second, requests_per_unit: 2, scope: local, algorithm: fixed_window}
`

// Await waits out a denial that its Retry-After says will pass, for a global and a local
// limit: the third request within a second is admitted after waiting, not refused.
func TestAwaitWaitsForRoom(t *testing.T) {
	for _, key := range []string{"user", "ip"} {
		var fs *fakeSleep
		l, clk := newLimiter(t, awaitRules, func(c *Config) {})
		fs = &fakeSleep{clk: clk}
		l.cfg.Sleep = fs.sleep
		req := Request{Domain: "api", Descriptors: [][]rules.Entry{desc(key, "1")}}
		var res Result
		for i := range 2 {
			if w, err := l.Await(context.Background(), req, time.Second, &res); err != nil || res.Code != CodeOK || w != 0 {
				t.Fatalf("%s: request %d: %v waited %v, %v", key, i, res.Code, w, err)
			}
		}
		start := clk.Now()
		w, err := l.Await(context.Background(), req, 2*time.Second, &res)
		if err != nil || res.Code != CodeOK || w <= 0 || w > time.Second+50*time.Millisecond {
			t.Fatalf("%s: third request: %v after waiting %v (err %v), want admitted within about a second", key, res.Code, w, err)
		}
		if got := clk.Now().Sub(start); got != w || fs.n == 0 {
			t.Fatalf("%s: waited %v by the clock, reported %v, %d sleeps", key, got, w, fs.n)
		}
		// With too short a delay it is refused at once, without sleeping.
		n := fs.n
		l.Decide(context.Background(), req) // fill again
		l.Decide(context.Background(), req)
		if w, err := l.Await(context.Background(), req, time.Millisecond, &res); err != nil || res.Code != CodeOverLimit || w != 0 || fs.n != n {
			t.Fatalf("%s: short delay: %v after %v (err %v, %d sleeps)", key, res.Code, w, err, fs.n-n)
		}
	}
}

// A client that goes away while waiting ends the wait with its context's error; a queue
// that is full refuses without waiting.
func TestAwaitCanceledAndQueueFull(t *testing.T) {
	l, _ := newLimiter(t, awaitRules, func(c *Config) { c.MaxWaiters = 1 })
	req := Request{Domain: "api", Descriptors: [][]rules.Entry{desc("user", "1")}}
	l.Decide(context.Background(), req)
	l.Decide(context.Background(), req)
	ctx, cancel := context.WithCancel(context.Background())
	release := make(chan struct{})
	entered := make(chan struct{})
	l.cfg.Sleep = func(ctx context.Context, d time.Duration) error {
		close(entered)
		<-release
		return ctx.Err()
	}
	done := make(chan error, 1)
	go func() {
		var res Result
		_, err := l.Await(ctx, req, 5*time.Second, &res)
		done <- err
	}()
	<-entered
	var res Result
	if _, err := l.Await(context.Background(), req, 5*time.Second, &res); !errors.Is(err, ErrQueueFull) || res.Code != CodeOverLimit {
		t.Fatalf("second waiter: %v, %v; want ErrQueueFull and a denial", res.Code, err)
	}
	cancel()
	close(release)
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled waiter returned %v", err)
	}
	if got := l.waiters.Load(); got != 0 {
		t.Fatalf("%d waiters left", got)
	}
}
