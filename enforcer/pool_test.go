package enforcer

import (
	"context"
	"testing"
	"time"

	"github.com/streamlimit/streamlimit/clock"
	"github.com/streamlimit/streamlimit/enforcer/rules"
	"github.com/streamlimit/streamlimit/enforcer/snapshot"
	"github.com/streamlimit/streamlimit/topics"
)

const poolRules = `
domain: api
pools:
  - name: all
    rate_limit: {requests_per_unit: 100, unit: minute}
    priorities: {paid: 100, free: 80, batch: 50}
descriptors:
  - key: plan
    value: paid
    priority: paid
    descriptors:
      - key: user
        rate_limit: {requests_per_unit: 10, unit: minute, pool: all, elastic: {max: 40, until: 50}}
  - key: plan
    value: free
    priority: free
    descriptors:
      - key: user
        rate_limit: {requests_per_unit: 1000, unit: minute, pool: all}
  - key: plan
    value: batch
    priority: batch
    descriptors:
      - key: user
        rate_limit: {requests_per_unit: 1000, unit: minute, pool: all}
`

func planReq(plan, user string) Request {
	return Request{Domain: "api", Descriptors: [][]rules.Entry{desc("plan", plan, "user", user)}}
}

// One site, no other traffic: the pool caps every client together, and lower priorities
// stop first — batch at 50 of 100, free at 80, paid at 100.
func TestPoolPrioritiesShedLowerTiersFirst(t *testing.T) {
	l, _ := newLimiter(t, poolRules, nil)
	if got := admitN(l, planReq("batch", "b"), 200); got != 50 {
		t.Fatalf("batch admitted %d, want 50 (its half of the pool)", got)
	}
	if got := admitN(l, planReq("free", "f"), 200); got != 30 {
		t.Fatalf("free admitted %d, want 30 (up to 80 of the pool)", got)
	}
	// paid clients: 10 each (elastic up to 40 while the pool is below half full: it is
	// already 80% full, so about 10 + 30 × (1 − 0.8)/(1 − 0.5) = 22 — but the snapshot is
	// empty here, so the elastic room is judged on no traffic: 40).
	res := l.Decide(context.Background(), planReq("paid", "p1"))
	if res.Code != CodeOK {
		t.Fatalf("paid denied with room in the pool: %+v", res.Statuses[0])
	}
	if got := admitN(l, planReq("paid", "p2"), 200); got != 19 {
		t.Fatalf("paid p2 admitted %d, want 19 (the pool's last 20 minus p1's one)", got)
	}
	res = l.Decide(context.Background(), planReq("batch", "b2"))
	if res.Code != CodeOverLimit || res.Statuses[0].Limit.Requests != 100 || res.Statuses[0].Requests != 50 {
		t.Fatalf("batch after the pool filled: %+v, want the pool's limit reported at batch's 50", res.Statuses[0])
	}
}

// An elastic limit rises to its max while its pool, across all sites, is below "until",
// and comes back linearly to its base as the pool fills.
func TestElasticFollowsThePool(t *testing.T) {
	clk := clock.NewFake(t0)
	sn, err := snapshot.NewMemory(snapshot.Config{Site: "eu", Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	heartbeat(t, sn, clk)
	cfg := loadRules(t, poolRules)
	poolKey := cfg.Pools("api")[0].Key
	setPool := func(total float64) {
		// us filled the pool earlier and is idle now; eu is where the demand is.
		c := topics.Count{Key: poolKey, Window: 60000, AsOf: clk.Now().UnixMilli(), Total: total,
			Sites: []topics.SiteCount{{Site: "eu", Demand: 10}, {Site: "us", Count: total}}}
		v, _ := c.MarshalBinary()
		if err := sn.Apply([]byte(poolKey), v); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		pool float64
		want int
	}{
		{0, 40},  // idle system: the client gets its elastic max
		{50, 40}, // at "until" still the max
		{75, 25}, // halfway from until to full: base + half the elastic room
		{95, 13}, // nearly full: base + 10% of the elastic room; the pool's room caps it below
	} {
		clk.Advance(2 * time.Minute) // the client's previous requests leave its window
		heartbeat(t, sn, clk)
		setPool(c.pool)
		l, err := New(Config{Tuning: Tuning{DefaultShare: 1, ShareDamping: -1, DemandPrior: -1}, Rules: rules.Static(cfg), Site: "eu", Clock: clk, Snapshot: sn})
		if err != nil {
			t.Fatal(err)
		}
		got := admitN(l, planReq("paid", "p"), 100)
		// The pool caps it too: eu's share of the pool's room is 1/1.05 (us, idle, keeps
		// MinShare of it), rounded either way.
		want := min(float64(c.want), (100-c.pool)/1.05)
		if float64(got) < want-1 || float64(got) > want+1 {
			t.Fatalf("pool at %v%%: admitted %d, want %.1f ± 1", c.pool, got, want)
		}
	}
}

func TestPoolRulesRejected(t *testing.T) {
	for _, y := range []string{
		"domain: a\ndescriptors:\n  - key: u\n    rate_limit: {unit: minute, requests_per_unit: 1, pool: nope}\n",
		"domain: a\npools:\n  - {name: p, rate_limit: {unit: minute, requests_per_unit: 9}}\ndescriptors:\n  - key: u\n    rate_limit: {unit: minute, requests_per_unit: 5, pool: p, elastic: {max: 3}}\n",
		"domain: a\ndescriptors:\n  - key: u\n    rate_limit: {unit: minute, requests_per_unit: 5, elastic: {max: 10}}\n",
		"domain: a\npools:\n  - {name: p, rate_limit: {unit: minute, requests_per_unit: 9}, priorities: {gold: 120}}\n",
		"domain: a\npools:\n  - {name: p, rate_limit: {unit: minute, requests_per_unit: 9, scope: local}}\n",
		"domain: a\ndescriptors:\n  - key: u\n    priority: gold\n    rate_limit: {unit: minute, requests_per_unit: 5}\n",
	} {
		if _, err := rules.Parse("bad.yaml", []byte(y)); err == nil {
			t.Errorf("accepted:\n%s", y)
		}
	}
}

// An overridden descriptor still spends its rule's pool: a caller that raises its own
// quota with Envoy's per-descriptor limit cannot take more of the capacity the pool
// guards, and its requests count toward the pool for everyone else.
func TestOverrideCountsTowardThePool(t *testing.T) {
	l, _ := newLimiter(t, poolRules, nil)
	over := planReq("batch", "b")
	over.Overrides = []Override{{Requests: 1000, Window: time.Minute}}
	if got := admitN(l, over, 200); got != 50 {
		t.Fatalf("overridden batch admitted %d, want 50 (its half of the pool, whatever its own limit)", got)
	}
	if got := admitN(l, planReq("free", "f"), 200); got != 30 {
		t.Fatalf("free admitted %d after the override's 50, want 30 (up to 80 of the pool)", got)
	}
	res := l.Decide(context.Background(), over)
	if st := res.Statuses[0]; res.Code != CodeOverLimit || st.Limit.Requests != 100 {
		t.Fatalf("override after the pool filled: %v %+v, want the pool's limit", res.Code, st)
	}
}
