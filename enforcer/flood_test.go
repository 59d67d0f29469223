//go:build !race

// A million keys through the race detector would take minutes and measure its shadow
// memory; make test runs this file in its race-free pass.

package enforcer

import (
	"context"
	"runtime"
	"runtime/debug"
	rtmetrics "runtime/metrics"
	"strconv"
	"testing"
	"time"

	"github.com/streamlimit/streamlimit/clock"
	"github.com/streamlimit/streamlimit/enforcer/algo"
	"github.com/streamlimit/streamlimit/enforcer/rules"
	"github.com/streamlimit/streamlimit/enforcer/sitecount"
	"github.com/streamlimit/streamlimit/enforcer/snapshot"
	"github.com/streamlimit/streamlimit/internal/memsize"
	"github.com/streamlimit/streamlimit/topics"
)

// TestKeyFloodAllocatesWithinBudget floods an Engine, set up as the enforcer command sets
// it up for a memory target of 256 MiB, with a million requests, each naming a new user
// (a global limit: key cache, site counter, and a count applied to the snapshot) and a
// new IP (a local limit: key cache, local counters), and with the Go soft memory limit at
// the target, as the command sets it. The Go runtime's memory (what it has mapped and not
// returned) must stay within the target throughout: without the byte budgets the same
// flood holds about 1.5 GiB live. The counters and the snapshot must also be at least half
// full (the budget is used, not avoided), and the newest key still counted exactly.
func TestKeyFloodAllocatesWithinBudget(t *testing.T) {
	const (
		target = 256 << 20
		keys   = 1_000_000
	)
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(target))
	mem := memsize.Split(target)
	clk := clock.NewFake(t0)
	sn, err := snapshot.NewMemory(snapshot.Config{Site: "eu", Clock: clk, MaxBytes: mem.Snapshot})
	if err != nil {
		t.Fatal(err)
	}
	heartbeat(t, sn, clk)
	local := algo.New(algo.Options{MaxBytes: mem.Local})
	counter := sitecount.NewLocal(sitecount.LocalOptions{MaxBytes: mem.Counter})
	l, err := New(Config{Rules: rules.Static(loadRules(t, `
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: ip
    rate_limit: {unit: minute, requests_per_unit: 100, scope: local}
`)), Site: "eu", Clock: clk, Snapshot: sn, Local: local, Counter: counter, KeyCacheBytes: mem.KeyCache, Publisher: discardPublisher{}})
	if err != nil {
		t.Fatal(err)
	}

	sample := []rtmetrics.Sample{{Name: "/memory/classes/total:bytes"}, {Name: "/memory/classes/heap/released:bytes"}}
	var peak uint64
	measure := func() {
		rtmetrics.Read(sample)
		peak = max(peak, sample[0].Value.Uint64()-sample[1].Value.Uint64())
	}
	runtime.GC()
	measure()
	ctx := context.Background()
	var res Result
	req := Request{Domain: "api", Descriptors: [][]rules.Entry{{{Key: "user"}}, {{Key: "ip"}}}}
	start := time.Now()
	for i := range keys {
		u := strconv.Itoa(i)
		req.Descriptors[0][0].Value = u
		req.Descriptors[1][0].Value = "10." + strconv.Itoa(i>>16&255) + "." + strconv.Itoa(i>>8&255) + "." + strconv.Itoa(i&255)
		l.DecideInto(ctx, req, &res)
		if res.Code != CodeOK {
			t.Fatalf("request %d denied: %+v", i, res.Statuses)
		}
		key := "api|user=" + u + "#60s"
		c := topics.Count{Key: key, Window: 60_000, AsOf: clk.Now().UnixMilli(), Total: 3,
			Sites: []topics.SiteCount{{Site: "eu", Count: 1, Demand: 1}, {Site: "us", Count: 2, Demand: 2}}}
		v, _ := c.MarshalBinary()
		_ = sn.Apply([]byte(key), v) // ErrFull once the snapshot's budget is spent
		if i%10_000 == 0 {
			measure()
			clk.Advance(10 * time.Millisecond)
		}
	}
	measure()
	t.Logf("%d requests in %v; Go memory peak %d MiB (target %d MiB); held: key cache %d MiB, local %d MiB (%d keys), site counter %d MiB (%d keys), snapshot %d MiB (%d keys)",
		keys, time.Since(start).Round(time.Millisecond), peak>>20, target>>20, l.keys.bytes()>>20,
		local.Bytes()>>20, local.Len(), counter.Bytes()>>20, counter.Len(), sn.Bytes()>>20, sn.Len())
	if peak > target {
		t.Errorf("Go memory peaked at %d MiB, above the %d MiB target", peak>>20, target>>20)
	}
	for _, s := range []struct {
		name         string
		held, budget int64
		least        int64
	}{
		// The key cache drops a generation at once, and its parts fill together: it is
		// between half full and full.
		{"key cache", l.keys.bytes(), mem.KeyCache, mem.KeyCache / 3},
		{"local counters", local.Bytes(), mem.Local, mem.Local / 2},
		{"site counter", counter.Bytes(), mem.Counter, mem.Counter / 2},
		{"snapshot", sn.Bytes(), mem.Snapshot, mem.Snapshot / 2},
	} {
		if s.held > s.budget || s.held < s.least {
			t.Errorf("%s holds %d bytes of its %d", s.name, s.held, s.budget)
		}
	}
	// The newest user is counted exactly: its one admitted request.
	out := []float64{0}
	if err := counter.Counts(ctx, clk.Now(), []sitecount.Op{{Key: "api|user=" + strconv.Itoa(keys-1) + "#60s", Window: time.Minute}}, out); err != nil || out[0] != 1 {
		t.Errorf("newest user counted %v (%v), want 1", out[0], err)
	}
}
