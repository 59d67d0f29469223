package enforcer

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/streamlimit/streamlimit/clock"
	"github.com/streamlimit/streamlimit/enforcer/rules"
	"github.com/streamlimit/streamlimit/enforcer/snapshot"
)

const denialRules = `
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1, scope: local}
  - key: ip
    rate_limit: {unit: minute, requests_per_unit: 1, scope: local}
    shadow_mode: true
`

func userReq(id string) Request {
	return Request{Domain: "api", Descriptors: [][]rules.Entry{desc("user", id)}}
}

// RecentDenials lists each denied key once, with its latest denial, newest first, and
// nothing for admitted requests or shadow-mode denials.
func TestRecentDenialsNewestFirstOnePerKey(t *testing.T) {
	l, clk := newLimiter(t, denialRules, nil)
	ctx := context.Background()
	ip := Request{Domain: "api", Descriptors: [][]rules.Entry{desc("ip", "1")}}
	for range 3 {
		l.Decide(ctx, ip) // shadow mode: never denied
		clk.Advance(time.Millisecond)
	}
	l.Decide(ctx, userReq("1")) // admitted
	if got := l.RecentDenials(); len(got) != 0 {
		t.Fatalf("RecentDenials = %+v before any denial", got)
	}
	at1 := clk.Advance(time.Millisecond)
	if l.Decide(ctx, userReq("1")).Code != CodeOverLimit {
		t.Fatal("second request of user 1 admitted")
	}
	l.Decide(ctx, userReq("2"))
	at2 := clk.Advance(time.Millisecond)
	l.Decide(ctx, userReq("2"))
	got := l.RecentDenials()
	if len(got) != 2 {
		t.Fatalf("RecentDenials = %+v, want users 2 and 1", got)
	}
	want := Denial{Time: at2, Site: "eu", Domain: "api", Rule: "api.user", Key: "api|user=2#60s", Scope: rules.Local, Requests: 1, Window: time.Minute}
	if got[0].Time.Equal(want.Time) {
		got[0].Time = want.Time // the same instant, in another location
	}
	if got[0] != want {
		t.Errorf("newest = %+v, want %+v", got[0], want)
	}
	if got[1].Key != "api|user=1#60s" || !got[1].Time.Equal(at1) {
		t.Errorf("second = %+v, want user 1 at %v", got[1], at1)
	}
	at3 := clk.Advance(time.Millisecond)
	l.Decide(ctx, userReq("1"))
	got = l.RecentDenials()
	if len(got) != 2 || got[0].Key != "api|user=1#60s" || !got[0].Time.Equal(at3) {
		t.Fatalf("after user 1 denied again: %+v, want user 1 first at %v and no second entry for it", got, at3)
	}
}

// The record is bounded: past recentDenialKeys keys, the oldest are forgotten.
func TestRecentDenialsBounded(t *testing.T) {
	l, clk := newLimiter(t, denialRules, nil)
	ctx := context.Background()
	const n = recentDenialKeys + 36
	for i := range n {
		id := strconv.Itoa(i)
		l.Decide(ctx, userReq(id))
		clk.Advance(time.Millisecond)
		l.Decide(ctx, userReq(id))
	}
	got := l.RecentDenials()
	if len(got) != recentDenialKeys {
		t.Fatalf("%d entries, want %d", len(got), recentDenialKeys)
	}
	for i, d := range got {
		if want := fmt.Sprintf("api|user=%d#60s", n-1-i); d.Key != want {
			t.Fatalf("entry %d = %s, want %s (the newest %d, newest first)", i, d.Key, want, recentDenialKeys)
		}
	}
}

// Denials within denialSampleGap of the last one recorded are not recorded.
func TestRecentDenialsSampled(t *testing.T) {
	l, clk := newLimiter(t, denialRules, nil)
	ctx := context.Background()
	l.Decide(ctx, userReq("1"))
	l.Decide(ctx, userReq("2"))
	l.Decide(ctx, userReq("1")) // recorded
	clk.Advance(denialSampleGap / 2)
	l.Decide(ctx, userReq("2")) // within the gap: not recorded
	if got := l.RecentDenials(); len(got) != 1 || got[0].Key != "api|user=1#60s" {
		t.Fatalf("RecentDenials = %+v, want user 1 alone", got)
	}
	clk.Advance(denialSampleGap / 2)
	l.Decide(ctx, userReq("2"))
	if got := l.RecentDenials(); len(got) != 2 || got[0].Key != "api|user=2#60s" {
		t.Fatalf("RecentDenials = %+v, want user 2 then user 1", got)
	}
}

// BenchmarkDecideDenied decides, in parallel, a global limit that every request exceeds:
// the path of a flood that RecentDenials samples. Compare with BenchmarkDecideGlobal.
func BenchmarkDecideDenied(b *testing.B) {
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
    rate_limit: {unit: minute, requests_per_unit: 1}
`)
	l, err := New(Config{Rules: rules.Static(cfg), Site: "eu", Clock: clk, Snapshot: sn, Publisher: discardPublisher{}})
	if err != nil {
		b.Fatal(err)
	}
	reqs := benchRequests()[:1000]
	ctx := context.Background()
	var warm Result
	for i := range reqs {
		l.DecideInto(ctx, reqs[i], &warm)
		l.DecideInto(ctx, reqs[i], &warm)
	}
	var next atomic.Uint64
	runtime.GC()
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		var res Result
		i := int(next.Add(7919)) % len(reqs)
		for n := 1; pb.Next(); n++ {
			if n%64 == 0 {
				// The clock moves on as the requests go, so that some denials are
				// recorded: one in 64 of each goroutine's at most.
				clk.Advance(denialSampleGap)
			}
			l.DecideInto(ctx, reqs[i], &res)
			if res.Code != CodeOverLimit {
				b.Fatal("admitted")
			}
			if i++; i == len(reqs) {
				i = 0
			}
		}
	})
}

// TestDocsDenials holds docs/operations.md's Console section to the record of denials it
// describes: its size and its sampling gap.
func TestDocsDenials(t *testing.T) {
	b, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "## Console")
	if !ok {
		t.Fatal("docs/operations.md has no Console section")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	section = strings.Join(strings.Fields(section), " ")
	for _, fact := range []string{
		fmt.Sprintf("the last %d keys denied", recentDenialKeys),
		fmt.Sprintf("a fixed table of %d keys", recentDenialKeys),
		fmt.Sprintf("at most once every %d microseconds", denialSampleGap.Microseconds()),
	} {
		if !strings.Contains(section, fact) {
			t.Errorf("docs/operations.md does not say %q", fact)
		}
	}
}
