package sitestore

import (
	"context"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/streamlimit/streamlimit/enforcer/algo"
	"github.com/streamlimit/streamlimit/internal/breaker"
)

// outageRun drives enforcers (Stores with FallbackShare 1/len) on one site limit of 50 per
// second (sliding window) from 16 callers each, in real time, and records when each
// admission was decided. fault is called after a second of load and returns when the
// fault is over; the load goes on for after more.
type outageRun struct {
	t      *testing.T
	stores []*Store
	op     algo.Op

	mu  sync.Mutex
	adm []time.Time
}

func newOutageRun(t *testing.T, addr string, enforcers int) *outageRun {
	r := &outageRun{t: t, op: algo.Op{Key: "api|user=mallory#1s", Algorithm: algo.SlidingWindow,
		Limit: algo.Limit{Requests: 50, Window: time.Second}, N: 1}}
	for range enforcers {
		s, err := New(Config{Addrs: []string{addr}, FallbackShare: 1 / float64(enforcers), Registerer: prometheus.NewRegistry()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		r.stores = append(r.stores, s)
	}
	return r
}

// run loads the stores, calls fault after a second, and stops the load after more.
func (r *outageRun) run(fault func(), after time.Duration) {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, s := range r.stores {
		for range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				out := make([]algo.Decision, 1)
				for {
					select {
					case <-stop:
						return
					default:
					}
					if ok, _ := s.AllowAll(context.Background(), time.Now(), []algo.Op{r.op}, out); ok {
						r.mu.Lock()
						r.adm = append(r.adm, time.Now())
						r.mu.Unlock()
					}
				}
			}()
		}
	}
	time.Sleep(time.Second)
	fault()
	time.Sleep(after)
	close(stop)
	wg.Wait()
}

// admitted returns the admissions decided in [from, to).
func (r *outageRun) admitted(from, to time.Time) int {
	n := 0
	for _, a := range r.adm {
		if !a.Before(from) && a.Before(to) {
			n++
		}
	}
	return n
}

// TestRedisStallKeepsToTheShare: while the site's Redis is stopped (SIGSTOP: connections
// stay open and calls hang until their timeout), two enforcers that share it admit
// together at most the limit over the stall (5% tolerance): each decides in process on its
// half, from its half of the last count Redis reported. Requests whose calls timed out are
// decided at the time they are decided, not at the time they were stamped a timeout
// earlier, which had made the in-process windows start over (2 632 admitted where 50/s
// allows 298 in a 6 s stall). The breaker opens although the seconds of successes before
// the stall keep the error rate low, and its gauge says so.
func TestRedisStallKeepsToTheShare(t *testing.T) {
	rd := startPrivateRedis(t)
	r := newOutageRun(t, rd.addr(), 2)
	const stall = 3 * time.Second
	var from, to time.Time
	var states []breaker.State
	var gauges []float64
	r.run(func() {
		from = time.Now()
		if err := rd.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		for time.Since(from) < stall {
			time.Sleep(100 * time.Millisecond)
			// The state around the gauge's reading: a sample in which it changed says
			// nothing about the gauge.
			st, g := r.stores[0].BreakerState(), value(t, r.stores[0].m.breakerState)
			if r.stores[0].BreakerState() != st {
				g = float64(st)
			}
			states, gauges = append(states, st), append(gauges, g)
		}
		to = time.Now()
		if err := rd.cmd.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
	}, time.Second)
	got, allowed := r.admitted(from, to), 50*to.Sub(from).Seconds()
	t.Logf("stall of %v: %d admitted, 50/s allows %.0f (%.3f×); breaker %v", to.Sub(from).Round(time.Millisecond), got, allowed, float64(got)/allowed, states)
	if float64(got) > 1.05*allowed {
		t.Errorf("two enforcers admitted %d during a %v stall of their Redis; 50/s allows %.0f (tolerance 5%%)", got, to.Sub(from), allowed)
	}
	closed := 0
	for i, st := range states {
		if gauges[i] != float64(st) {
			t.Errorf("sample %d: breaker_state gauge %v, breaker %v", i, gauges[i], st)
		}
		if i >= 10 && st == breaker.Closed {
			closed++
		}
	}
	if closed > 0 {
		t.Errorf("breaker closed in %d of the %d samples after the stall's first second", closed, len(states)-10)
	}
}

// TestRedisCrashKeepsToTheShare: the site's Redis is killed (SIGKILL) and restarted 2 s
// later without its data. Two enforcers admit at most the limit from the crash until a
// second after the restart (5% tolerance): in process on their halves meanwhile, then each
// restores its half of the last known count in the empty Redis and writes back what it
// admitted, before Redis decides again.
func TestRedisCrashKeepsToTheShare(t *testing.T) {
	rd := startPrivateRedis(t)
	r := newOutageRun(t, rd.addr(), 2)
	var from time.Time
	r.run(func() {
		from = time.Now()
		rd.stop()
		time.Sleep(2 * time.Second)
		rd.start()
	}, time.Second)
	to := time.Now()
	got, allowed := r.admitted(from, to), 50*to.Sub(from).Seconds()
	t.Logf("crash, restart empty, and 1 s after: %v, %d admitted, 50/s allows %.0f (%.3f×)", to.Sub(from).Round(time.Millisecond), got, allowed, float64(got)/allowed)
	if float64(got) > 1.05*allowed {
		t.Errorf("two enforcers admitted %d in the %v from a crash of their Redis to a second after its restart; 50/s allows %.0f (tolerance 5%%)", got, to.Sub(from), allowed)
	}
}
