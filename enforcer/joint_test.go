package enforcer

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/streamlimit/streamlimit/clock"
	"github.com/streamlimit/streamlimit/enforcer/rules"
	"github.com/streamlimit/streamlimit/enforcer/sitecount"
	"github.com/streamlimit/streamlimit/enforcer/sitestore"
	"github.com/streamlimit/streamlimit/enforcer/snapshot"
	"github.com/streamlimit/streamlimit/internal/testenv"
)

// A request with a global limit and a site limit, the site counter and the site limits in
// one Redis, is decided in one script call: the global counts checked, the site limit taken,
// the counts added, all or nothing. Refused by its site limit, it adds nothing to the global
// count; refused by its global limit, it takes nothing from its site limit.
func TestGlobalWithSiteOneRedisCall(t *testing.T) {
	client := testenv.RedisClient(t)
	reg := prometheus.NewRegistry()
	store, err := sitestore.New(sitestore.Config{
		Redis:      sitestore.Redis{Client: client, KeyPrefix: testenv.KeyPrefix(t), Timeout: 2 * time.Second, ExpirySlack: time.Hour},
		Registerer: reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	counter := sitestore.NewCounter(store, sitestore.CounterOptions{})
	l, _, _, pub := newGlobal(t, map[string]float64{"eu": 1}, func(c *Config) {
		c.Counter, c.SiteStore = counter, store
	})
	l.cfg.Rules = rules.Static(loadRules(t, globalRules+"  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 3, scope: site}\n"))
	ctx := context.Background()
	calls := func() float64 {
		t.Helper()
		return testenv.Counter(t, reg, "streamlimit_redis_batches_total")
	}
	req := Request{Domain: "api", Descriptors: [][]rules.Entry{desc("user", "42"), desc("tenant", "t")}}
	for i := range 3 {
		before := calls()
		res := l.Decide(ctx, req)
		if res.Code != CodeOK || res.Statuses[0].Fallback || res.Statuses[1].Fallback {
			t.Fatalf("request %d: %v %+v, want admitted without fallback", i, res.Code, res.Statuses)
		}
		if got := calls() - before; got != 1 {
			t.Fatalf("request %d: %v Redis script calls, want 1", i, got)
		}
		if got, want := res.Statuses[0].Remaining, int64(100-i-1); got != want {
			t.Fatalf("request %d: user remaining %d, want %d", i, got, want)
		}
		if got, want := res.Statuses[1].Remaining, int64(3-i-1); got != want {
			t.Fatalf("request %d: tenant remaining %d, want %d", i, got, want)
		}
	}
	if got := pub.hits[globalKey]; got != 3 {
		t.Fatalf("%d global hits published, want 3", got)
	}
	// The site limit (3 a minute) is spent: refused, and the global count keeps its 3.
	res := l.Decide(ctx, req)
	if res.Code != CodeOverLimit || res.Statuses[1].Code != CodeOverLimit {
		t.Fatalf("fourth: %v %+v, want refused by the site limit", res.Code, res.Statuses)
	}
	counts := make([]float64, 1)
	if err := counter.Counts(ctx, l.cfg.Clock.Now(), []sitecount.Op{{Key: globalKey, Window: time.Minute}}, counts); err != nil || counts[0] != 3 {
		t.Fatalf("global count %v (%v) after the refused request, want 3", counts[0], err)
	}

	// Refused by the global limit (otp, a key new to every site: this site's default share
	// of 5 per 10 s) with site room: the refused request takes nothing from the site limit.
	l.cfg.Rules = rules.Static(loadRules(t, globalRules+"  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 100, scope: site}\n"))
	admitted, _ := spendOTP(t, l)
	res = l.Decide(ctx, Request{Domain: "api", Descriptors: [][]rules.Entry{desc("tenant", "u")}})
	if got, want := res.Statuses[0].Remaining, int64(100-admitted-1); got != want {
		t.Fatalf("tenant remaining %d after %d admitted otp requests and one of its own, want %d (the refused ones took nothing)", got, admitted, want)
	}
}

// Concurrent requests with a global and a site limit, batched together in one Redis: the
// limit that binds admits exactly its allowance, and the other keeps exactly what the
// admitted requests took (nothing of the refused ones), whichever of the two binds.
func TestGlobalWithSiteConcurrent(t *testing.T) {
	client := testenv.RedisClient(t)
	for _, c := range []struct {
		name         string
		user, tenant int // requests a minute
		want         int
	}{
		{"site binds", 100, 60, 60},
		{"global binds", 40, 100, 40},
	} {
		t.Run(c.name, func(t *testing.T) {
			store, err := sitestore.New(sitestore.Config{Redis: sitestore.Redis{Client: client, KeyPrefix: testenv.KeyPrefix(t), Timeout: 5 * time.Second, ExpirySlack: time.Hour}})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = store.Close() })
			counter := sitestore.NewCounter(store, sitestore.CounterOptions{})
			l, _, _, _ := newGlobal(t, nil, func(cfg *Config) { cfg.Counter, cfg.SiteStore, cfg.DefaultShare = counter, store, 1 })
			l.cfg.Rules = rules.Static(loadRules(t, fmt.Sprintf("domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: %d}\n  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: %d, scope: site}\n", c.user, c.tenant)))
			req := Request{Domain: "api", Descriptors: [][]rules.Entry{desc("user", "7"), desc("tenant", "t")}}
			var admitted atomic.Int64
			var wg sync.WaitGroup
			for range 32 {
				wg.Go(func() {
					for range 8 {
						res := l.Decide(context.Background(), req)
						if res.Statuses[0].Fallback || res.Statuses[1].Fallback {
							t.Errorf("a fallback answer: %+v", res.Statuses)
						}
						if res.Code == CodeOK {
							admitted.Add(1)
						}
					}
				})
			}
			wg.Wait()
			if got := admitted.Load(); got != int64(c.want) {
				t.Fatalf("%d of 256 admitted, want %d", got, c.want)
			}
			counts := make([]float64, 1)
			now := l.cfg.Clock.Now()
			if err := counter.Counts(context.Background(), now, []sitecount.Op{{Key: "api|user=7#60s", Window: time.Minute}}, counts); err != nil || counts[0] != float64(c.want) {
				t.Fatalf("global count %v (%v), want %d: the refused requests added to it", counts[0], err, c.want)
			}
			res := l.Decide(context.Background(), Request{Domain: "api", Descriptors: [][]rules.Entry{desc("tenant", "t")}})
			if left := c.tenant - c.want; (left > 0) != (res.Code == CodeOK) || (left > 0 && res.Statuses[0].Remaining != int64(left-1)) {
				t.Fatalf("site limit after: %v %+v, want %d left before this request", res.Code, res.Statuses[0], left)
			}
		})
	}
}

// BenchmarkGlobalWithSite decides requests with a global limit and a site limit, both in one
// real Redis (STREAMLIMIT_REDIS_ADDR), from 32 concurrent callers on 10 000 clients: joint
// in one script call per request (batched with the others), apart in three, the stages
// one after the other as before the joint call existed. Both in the same run, so their
// ratio is the measure; redis-calls/op is the script calls per request.
func BenchmarkGlobalWithSite(b *testing.B) {
	client := testenv.RedisClient(b)
	for _, mode := range []string{"apart", "joint"} {
		b.Run(mode, func(b *testing.B) {
			reg := prometheus.NewRegistry()
			store, err := sitestore.New(sitestore.Config{Redis: sitestore.Redis{Client: client, KeyPrefix: testenv.KeyPrefix(b)}, Registerer: reg})
			if err != nil {
				b.Fatal(err)
			}
			defer store.Close()
			clk := clock.NewFake(time.Now())
			sn, err := snapshot.NewMemory(snapshot.Config{Site: "eu", Clock: clk})
			if err != nil {
				b.Fatal(err)
			}
			heartbeat(b, sn, clk)
			l, err := New(Config{
				Tuning: Tuning{DefaultShare: 1},
				Rules: rules.Static(loadRules(b, `
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1000000000}
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 1000000000, scope: site}
`)),
				Site:      "eu",
				Clock:     clk,
				Snapshot:  sn,
				Publisher: discardPublisher{},
				SiteStore: store,
				Counter:   sitestore.NewCounter(store, sitestore.CounterOptions{}),
			})
			if err != nil {
				b.Fatal(err)
			}
			if mode == "apart" {
				l.joint = nil
			}
			const clients = 10_000
			reqs := make([]Request, clients)
			for i := range reqs {
				reqs[i] = Request{Domain: "api", Descriptors: [][]rules.Entry{desc("user", strconv.Itoa(i)), desc("tenant", strconv.Itoa(i))}}
			}
			ctx := context.Background()
			var next atomic.Uint64
			before := testenv.Counter(b, reg, "streamlimit_redis_batches_total")
			b.SetParallelism(32 / runtime.GOMAXPROCS(0))
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				var res Result
				for pb.Next() {
					l.DecideInto(ctx, reqs[next.Add(1)%clients], &res)
					if res.Code != CodeOK || res.Statuses[0].Fallback || res.Statuses[1].Fallback {
						b.Errorf("%v %+v, want admitted without fallback", res.Code, res.Statuses)
						return
					}
				}
			})
			b.StopTimer()
			b.ReportMetric((testenv.Counter(b, reg, "streamlimit_redis_batches_total")-before)/float64(b.N), "redis-calls/op")
		})
	}
}
