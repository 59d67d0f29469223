package sitestore

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/streamlimit/streamlimit/enforcer/algo"
)

// TestSecondLaneOnlyForAFullBatch: while one batch is in flight (held in a paused Redis),
// requests that arrive wait for the next batch rather than open the second lane, until a
// full batch (MaxBatch) waits; then the second lane sends it. With 2 lanes and batches of
// 4, 1 + 3 + 4 requests go in three script calls (the old rule, a lane whenever one was
// free, sent the second request alone and made four) and every one is decided in Redis.
func TestSecondLaneOnlyForAFullBatch(t *testing.T) {
	reg := prometheus.NewRegistry()
	rd := pausableRedis(t)
	s := newStore(t, rd, "lanes:", func(c *Config) {
		c.Registerer, c.Lanes, c.MaxBatch = reg, 2, 4
	})
	ctx := context.Background()
	b := s.batch
	state := func() (busy, queued int) {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.busy, len(b.queue)
	}
	waitFor := func(what string, ok func(busy, queued int) bool) {
		t.Helper()
		for deadline := time.Now().Add(testTimeout); ; time.Sleep(time.Millisecond) {
			busy, queued := state()
			if ok(busy, queued) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d lanes busy, %d requests queued", what, busy, queued)
			}
		}
	}
	if err := rd.Do(ctx, "CLIENT", "PAUSE", "300").Err(); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var fellBack []string
	send := func(n, from int) {
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				op := algo.Op{Key: fmt.Sprintf("d|lane%d", from+i), Algorithm: algo.FixedWindow, Limit: algo.Limit{Requests: 10, Window: time.Minute}, N: 1}
				out := make([]algo.Decision, 1)
				if ok, fb := s.AllowAll(ctx, t0, []algo.Op{op}, out); fb || !ok {
					mu.Lock()
					fellBack = append(fellBack, op.Key)
					mu.Unlock()
				}
			}()
		}
	}
	send(1, 0)
	waitFor("the first request in flight", func(busy, queued int) bool { return busy == 1 && queued == 0 })
	send(3, 1)
	waitFor("three requests waiting", func(_, queued int) bool { return queued == 3 })
	if busy, _ := state(); busy != 1 {
		t.Fatalf("with one batch in flight and 3 of 4 requests waiting, %d lanes are busy; want 1", busy)
	}
	send(4, 4)
	waitFor("a full batch sent on the second lane", func(busy, queued int) bool { return busy == 2 && queued == 3 })
	wg.Wait()
	if len(fellBack) != 0 {
		t.Errorf("requests decided in process or denied: %v", fellBack)
	}
	if n := value(t, s.m.batches); n != 3 {
		t.Errorf("%v script calls for 1 + 3 + 4 requests; want 3", n)
	}
}
