package enforcer

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/streamlimit/streamlimit/clock"
	"github.com/streamlimit/streamlimit/enforcer/algo"
	"github.com/streamlimit/streamlimit/enforcer/rules"
	"github.com/streamlimit/streamlimit/enforcer/sitecount"
	"github.com/streamlimit/streamlimit/enforcer/snapshot"
	"github.com/streamlimit/streamlimit/internal/memsize"
)

// TestKeyFloodKeepsLimitedClients is the attack on the memory budget: 20 users exhaust
// their limits (3 per hour, global: this site's exact count in the sitecount.Local; and per
// IP, local: algo.Store), then 30 000 requests each name a new user and a new IP, through
// an Engine whose structures share a 16 MiB budget (the site counter holds about 5 700
// keys, the local counters 4 300, the key cache a few thousand). Every exhausted user and
// IP must still be denied: the budget bounds bytes, never resets a limit. Before, a full
// structure evicted the oldest entries, the exhausted ones: 20 of 20 were admitted again.
func TestKeyFloodKeepsLimitedClients(t *testing.T) {
	mem := memsize.Split(16 << 20)
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
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: ip
    rate_limit: {unit: hour, requests_per_unit: 3, scope: local}
`)), Site: "eu", Clock: clk, Snapshot: sn, Local: local, Counter: counter, KeyCacheBytes: mem.KeyCache, Publisher: discardPublisher{}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var res Result
	decide := func(desc, value string) Code {
		l.DecideInto(ctx, Request{Domain: "api", Descriptors: [][]rules.Entry{{{Key: desc, Value: value}}}}, &res)
		return res.Code
	}
	for i := range 20 {
		for _, d := range []string{"user", "ip"} {
			v := "exhausted-" + strconv.Itoa(i)
			for range 3 {
				if decide(d, v) != CodeOK {
					t.Fatalf("%s=%s denied within its limit", d, v)
				}
			}
			if decide(d, v) != CodeOverLimit {
				t.Fatalf("%s=%s admitted past its limit", d, v)
			}
		}
	}
	req := Request{Domain: "api", Descriptors: [][]rules.Entry{{{Key: "user"}}, {{Key: "ip"}}}}
	for i := range 30_000 {
		req.Descriptors[0][0].Value = "flood-" + strconv.Itoa(i)
		req.Descriptors[1][0].Value = "10." + strconv.Itoa(i>>16&255) + "." + strconv.Itoa(i>>8&255) + "." + strconv.Itoa(i&255)
		l.DecideInto(ctx, req, &res)
		if i%1000 == 0 {
			clk.Advance(time.Second)
			heartbeat(t, sn, clk)
		}
	}
	for _, d := range []string{"user", "ip"} {
		readmitted := 0
		for i := range 20 {
			if decide(d, "exhausted-"+strconv.Itoa(i)) == CodeOK {
				readmitted++
			}
		}
		if readmitted > 0 {
			t.Errorf("%s: %d of 20 exhausted clients admitted again after the flood", d, readmitted)
		}
	}
	if counter.Evicted() == 0 || local.Stats().EvictedLive == 0 {
		t.Errorf("the flood evicted nothing (site counter %d, local %+v): the test does not fill the budget", counter.Evicted(), local.Stats())
	}
	t.Logf("site counter: %d keys, %d evicted, %d refused; local: %+v; key cache %d bytes", counter.Len(), counter.Evicted(), counter.Refused(), local.Stats(), l.keys.bytes())
}
