package enforcer

import (
	"context"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/streamlimit/streamlimit/clock"
	"github.com/streamlimit/streamlimit/enforcer/rules"
	"github.com/streamlimit/streamlimit/enforcer/snapshot"
	"github.com/streamlimit/streamlimit/topics"
)

const benchKeys = 100_000

// benchRequests builds one request per client, outside the timed loop.
func benchRequests() []Request {
	reqs := make([]Request, benchKeys)
	for i := range reqs {
		reqs[i] = Request{Domain: "api", Descriptors: [][]rules.Entry{{{Key: "user", Value: strconv.Itoa(i)}}}}
	}
	return reqs
}

// BenchmarkDecideGlobal decides a global limit (sliding window across sites) for 100 k
// clients, all present in the snapshot, with the in-process site counter: the whole
// request path of an enforcer, in parallel. Compare with BenchmarkXTimeRateAllow, run in
// the same invocation.
func BenchmarkDecideGlobal(b *testing.B) {
	clk := clock.NewFake(t0)
	sn, err := snapshot.NewMemory(snapshot.Config{Site: "eu", Clock: clk})
	if err != nil {
		b.Fatal(err)
	}
	heartbeat(b, sn, clk)
	cfg := loadRules(b, `
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1000000000}
`)
	reqs := benchRequests()
	for i := range reqs {
		key := cfg.Match("api", reqs[i].Descriptors[0]).Key(reqs[i].Descriptors[0], 0)
		c := topics.Count{Key: key, Window: 60000, AsOf: clk.Now().UnixMilli(), Total: 10, Sites: []topics.SiteCount{{Site: "eu", Count: 4}, {Site: "us", Count: 6}}}
		v, _ := c.MarshalBinary()
		if err := sn.Apply([]byte(key), v); err != nil {
			b.Fatal(err)
		}
	}
	l, err := New(Config{Rules: rules.Static(cfg), Site: "eu", Clock: clk, Snapshot: sn, Publisher: discardPublisher{}})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	var warm Result
	for i := range reqs {
		l.DecideInto(ctx, reqs[i], &warm)
	}
	var next atomic.Uint64
	runtime.GC()
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		var res Result
		i := int(next.Add(7919)) % benchKeys
		for pb.Next() {
			l.DecideInto(ctx, reqs[i], &res)
			if res.Code != CodeOK {
				b.Fatal("denied")
			}
			if i++; i == benchKeys {
				i = 0
			}
		}
	})
}

// BenchmarkXTimeRateAllow is the baseline: golang.org/x/time/rate's Allow on a map of
// 100 k limiters (one per client, found by a map lookup under a read lock), in parallel.
func BenchmarkXTimeRateAllow(b *testing.B) {
	var mu sync.RWMutex
	lims := make(map[string]*rate.Limiter, benchKeys)
	keys := make([]string, benchKeys)
	for i := range keys {
		keys[i] = "api|user=" + strconv.Itoa(i) + "#60s"
		lims[keys[i]] = rate.NewLimiter(rate.Limit(1e9), 1e9)
	}
	var next atomic.Uint64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := int(next.Add(7919)) % benchKeys
		for pb.Next() {
			mu.RLock()
			l := lims[keys[i]]
			mu.RUnlock()
			if !l.Allow() {
				b.Fatal("denied")
			}
			if i++; i == benchKeys {
				i = 0
			}
		}
	})
}

// BenchmarkDecideLocal decides one local limit per algorithm through the whole Engine.
func BenchmarkDecideLocal(b *testing.B) {
	for _, alg := range []string{"token_bucket", "leaky_bucket", "fixed_window", "sliding_log", "sliding_window", "gcra"} {
		b.Run(alg, func(b *testing.B) {
			l, _ := newLimiter(b, `
domain: api
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 1000000000, scope: local, algorithm: `+alg+`}
`, nil)
			reqs := benchRequests()[:10_000]
			ctx := context.Background()
			var res Result
			for i := range reqs {
				l.DecideInto(ctx, reqs[i], &res)
			}
			b.ReportAllocs()
			b.ResetTimer()
			i := 0
			for b.Loop() {
				l.DecideInto(ctx, reqs[i], &res)
				if i++; i == len(reqs) {
					i = 0
				}
			}
		})
	}
}

type discardPublisher struct{}

func (discardPublisher) Hit(string, time.Duration, int)    {}
func (discardPublisher) Denied(string, time.Duration, int) {}
