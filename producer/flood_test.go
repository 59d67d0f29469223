package producer

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math"
	"math/big"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/streamlimit/streamlimit/clock"
)

// A flood of new keys, twice the buffer bound per second, must not cost the keys that
// already carry traffic a single hit: idle counters (the flood's own, hit once) are
// evicted to make room, the heavy keys' pending counts are never dropped, and every hit is
// either in the topic or counted as dropped with its reason.
func TestKeyFloodKeepsHeavyKeys(t *testing.T) {
	for _, tc := range []struct {
		name      string
		newPerStp int // new keys per 10 ms step
		wantDrops bool
	}{
		// 2 000 new keys/s against a bound of 1 000: room comes from idle counters.
		{"evict idle", 20, false},
		// 200 000 new keys/s: every held counter has unsent hits between two flushes,
		// nothing is idle, and new keys are dropped (counted, reason no_room) — never
		// the heavy keys' hits.
		{"no room", 2000, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newFake(t, 4, "hits")
			clk := clock.NewFake(time.UnixMilli(1_763_740_000_000))
			var logs bytes.Buffer
			p, err := New(Config{Brokers: c.ListenAddrs(), Site: "eu", Clock: clk, FlushInterval: -1,
				MaxBufferedKeys: 1000, SiteHeartbeatInterval: -1, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			if err != nil {
				t.Fatal(err)
			}
			heavy := map[string]int64{}
			var sent int64
			next := 0
			for step := range 500 { // 5 s of fake time
				for k := range 10 {
					key := fmt.Sprintf("heavy-%d", k)
					n := 1 + k%4
					p.Hit(key, time.Minute, n)
					heavy[key] += int64(n)
					sent += int64(n)
				}
				for range tc.newPerStp {
					p.Hit(fmt.Sprintf("new-%d", next), time.Minute, 1)
					next++
					sent++
				}
				clk.Advance(10 * time.Millisecond)
				if step%5 == 4 {
					p.flush(false) // the background flush, every 50 ms
				}
			}
			if err := p.Close(context.Background()); err != nil {
				t.Fatal(err)
			}
			st := p.Stats()
			got := readTopic(t, c.ListenAddrs(), "hits")
			var delivered int64
			for _, n := range got.counts {
				delivered += n
			}
			for key, want := range heavy {
				if n := got.counts[counter{key, 60_000}]; n != want {
					t.Errorf("%s: %d hits in the topic, want %d", key, n, want)
				}
			}
			if delivered+st.DroppedHits != sent || st.HitsIn != delivered {
				t.Errorf("sent %d, delivered %d, dropped %d, stats %+v", sent, delivered, st.DroppedHits, st)
			}
			if st.DroppedByReason[DropNoRoom] != st.DroppedHits {
				t.Errorf("drops by reason %v, want all no_room", st.DroppedByReason)
			}
			if tc.wantDrops != (st.DroppedHits > 0) {
				t.Errorf("dropped %d hits, want drops: %v", st.DroppedHits, tc.wantDrops)
			}
			if tc.wantDrops && !strings.Contains(logs.String(), "reason=no_room") {
				t.Errorf("no dropped-hits log with its reason; logs:\n%s", logs.String())
			}
			if st.BufferedKeys > 1000 {
				t.Errorf("buffered keys %d over the bound", st.BufferedKeys)
			}
		})
	}
}

// Counts never overflow: hits of one bucket beyond MaxInt64 (hits and denials together)
// are split into several records, each valid, whose sum is every hit; the running totals
// saturate instead of wrapping.
func TestCountsNeverOverflow(t *testing.T) {
	c := newFake(t, 1, "hits")
	clk := clock.NewFake(time.UnixMilli(1_763_740_000_000))
	p, err := New(Config{Brokers: c.ListenAddrs(), Site: "eu", Clock: clk, FlushInterval: -1,
		SiteHeartbeatInterval: -1, Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	want := map[string]*big.Int{}
	wantDenied := map[string]*big.Int{}
	add := func(m map[string]*big.Int, k string, n int) {
		if m[k] == nil {
			m[k] = new(big.Int)
		}
		m[k].Add(m[k], big.NewInt(int64(n)))
	}
	for range 200 {
		k := fmt.Sprintf("k%d", rng.IntN(3))
		var n int
		switch rng.IntN(3) {
		case 0:
			n = math.MaxInt - rng.IntN(1000)
		case 1:
			n = 1 + rng.IntN(1000)
		default:
			n = math.MaxInt/2 + rng.IntN(1000)
		}
		if rng.IntN(4) == 0 {
			p.Denied(k, time.Minute, n)
			add(wantDenied, k, n)
		} else {
			p.Hit(k, time.Minute, n)
			add(want, k, n)
		}
		if rng.IntN(20) == 0 {
			clk.Advance(100 * time.Millisecond)
		}
	}
	if err := p.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	got := readTopic(t, c.ListenAddrs(), "hits")
	sum, sumDenied := map[string]*big.Int{}, map[string]*big.Int{}
	for _, h := range got.hits {
		if err := h.Validate(); err != nil {
			t.Fatalf("record %+v: %v", h, err)
		}
		add(sum, h.Key, int(h.Count))
		add(sumDenied, h.Key, int(h.Denied))
	}
	for k, w := range want {
		if sum[k] == nil || sum[k].Cmp(w) != 0 {
			t.Errorf("%s: %v hits in the topic, want %v", k, sum[k], w)
		}
	}
	for k, w := range wantDenied {
		if sumDenied[k] == nil || sumDenied[k].Cmp(w) != 0 {
			t.Errorf("%s: %v denied in the topic, want %v", k, sumDenied[k], w)
		}
	}
	if st := p.Stats(); st.HitsIn != math.MaxInt64 || st.DroppedHits != 0 {
		t.Errorf("stats %+v: want hits_in saturated at MaxInt64 and nothing dropped", st)
	}
}

// Counts that wait for Kafka are merged per (key, window, bucket) unless the merge would
// overflow: then they are kept apart, and the unsent total saturates.
func TestUnsentNeverOverflows(t *testing.T) {
	c := newFake(t, 1, "hits")
	p, err := New(Config{Brokers: c.ListenAddrs(), Site: "eu", FlushInterval: -1, SiteHeartbeatInterval: -1, Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(context.Background())
	r := record{ck: counterKey{"k", 60_000}, bucket: 1000, n: math.MaxInt64 - 5}
	p.keepUnsent(r)
	p.keepUnsent(r)
	p.keepUnsent(record{ck: r.ck, bucket: 1000, n: 3})
	p.unsentMu.Lock()
	parts, total := len(p.unsent), new(big.Int)
	for rk, c := range p.unsent {
		if c.n < 0 || rk.bucket != 1000 {
			t.Errorf("unsent %+v = %+v", rk, c)
		}
		total.Add(total, big.NewInt(c.n))
	}
	p.unsentMu.Unlock()
	want := new(big.Int).Add(new(big.Int).Mul(big.NewInt(math.MaxInt64-5), big.NewInt(2)), big.NewInt(3))
	if parts != 2 || total.Cmp(want) != 0 {
		t.Errorf("%d unsent counts summing to %v, want 2 summing to %v", parts, total, want)
	}
	if st := p.Stats(); st.UnsentHits != math.MaxInt64 {
		t.Errorf("unsent hits %d, want saturated at MaxInt64", st.UnsentHits)
	}
}

// A flood of bulk hits (RLQS usage reports over ever new buckets) must not cost the
// decisions' hits a single one, new counters included: bulk counters hold at most their
// part of the buffer bound, their excess is dropped and counted as bulk_no_room, and the
// decisions' counters, heavy or new, keep the rest.
func TestBulkFloodKeepsDecisionHits(t *testing.T) {
	c := newFake(t, 4, "hits")
	clk := clock.NewFake(time.UnixMilli(1_763_740_000_000))
	p, err := New(Config{Brokers: c.ListenAddrs(), Site: "eu", Clock: clk, FlushInterval: -1,
		MaxBufferedKeys: 1000, SiteHeartbeatInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	bulk := p.Bulk()
	decided := map[string]int64{}
	var sent int64
	next := 0
	for step := range 500 { // 5 s of fake time
		for k := range 10 {
			key := fmt.Sprintf("heavy-%d", k)
			p.Hit(key, time.Minute, 3)
			decided[key] += 3
		}
		// A new client of the check API every step, hit twice.
		key := fmt.Sprintf("client-%d", step)
		p.Hit(key, time.Minute, 1)
		p.Denied(key, time.Minute, 1)
		p.Hit(key, time.Minute, 1)
		decided[key] += 2
		for range 2000 { // 200 000 new bulk counters a second
			bulk.Hit(fmt.Sprintf("rlqs-%d", next), time.Minute, 5)
			next++
			sent += 5
		}
		clk.Advance(10 * time.Millisecond)
		if step%5 == 4 {
			p.flush(false)
		}
		if b := p.bulk.Load(); b > p.maxBulk {
			t.Fatalf("step %d: %d bulk counters and counts, bound %d", step, b, p.maxBulk)
		}
	}
	if err := p.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	st := p.Stats()
	got := readTopic(t, c.ListenAddrs(), "hits")
	for key, want := range decided {
		if n := got.counts[counter{key, 60_000}]; n != want {
			t.Errorf("%s: %d hits in the topic, want %d", key, n, want)
		}
	}
	if st.DroppedByReason[DropNoRoom] != 0 || st.DroppedByReason[DropKafkaBacklog] != 0 {
		t.Errorf("drops by reason %v: none but bulk_no_room expected", st.DroppedByReason)
	}
	if st.DroppedByReason[DropBulkNoRoom] == 0 || st.DroppedHits != st.DroppedByReason[DropBulkNoRoom] {
		t.Errorf("drops by reason %v: the bulk flood's excess should be dropped as bulk_no_room", st.DroppedByReason)
	}
	var delivered int64
	for _, n := range got.counts {
		delivered += n
	}
	var decidedSum int64
	for _, n := range decided {
		decidedSum += n
	}
	if delivered+st.DroppedHits != sent+decidedSum {
		t.Errorf("sent %d, delivered %d, dropped %d", sent+decidedSum, delivered, st.DroppedHits)
	}
}
