package enforcer

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/streamlimit/streamlimit/enforcer/rules"
)

// TestReportCountsAndPublishes: reported admissions go to this site's exact count without a
// cap and to the publisher as hits, denials as demand, and the quota describes the limit
// as a decision would see it (the cap of a fresh snapshot's key, the count after the
// usage, the count once the hits have left the window).
func TestReportCountsAndPublishes(t *testing.T) {
	l, clk, _, pub := newGlobal(t, map[string]float64{"eu": 10, "us": 30}, noDamping)
	ctx := context.Background()
	req := Request{Domain: "api", Descriptors: [][]rules.Entry{desc("user", "42")}}
	now := clk.Now()

	// What a decision would allow this site: its cap, as DecideAt's status shows it.
	var res Result
	l.DecideAt(ctx, now, req, &res)
	wantCap := 1 + float64(res.Statuses[0].Remaining) // its count after the request, plus what remains

	rep := l.Reporter(req)
	qs, other := rep.Report(ctx, now, 150, 7, 30*time.Second, nil)
	if other != 0 || len(qs) != 1 {
		t.Fatalf("Report: %d quotas, %d other limits; want 1, 0", len(qs), other)
	}
	q := qs[0]
	if q.Key != globalKey || q.Window != time.Minute || q.Limit != 100 || q.Shadow {
		t.Fatalf("quota %+v", q)
	}
	// The decision above took 1; the report adds 150 although that is past any cap.
	if q.Count != 151 {
		t.Errorf("Count = %v, want 151 (1 decided + 150 reported, uncapped)", q.Count)
	}
	if q.Later != q.Count {
		t.Errorf("Later = %v 30 s ahead of hits made now, want %v (still in the window)", q.Later, q.Count)
	}
	if pub.get(globalKey) != 151 || pub.denied[globalKey] != 7 {
		t.Errorf("published %d hits and %d denied, want 151 and 7", pub.get(globalKey), pub.denied[globalKey])
	}
	if q.Cap <= 0 || q.Cap > 100 || q.Fallback {
		t.Errorf("Cap = %v (fallback %v), want this site's part of 100", q.Cap, q.Fallback)
	}
	// After the window the hits have left: Later at now+61s is 0, and the cap is still
	// the one a decision sees.
	qs, _ = rep.Report(ctx, now, 0, 0, 61*time.Second, qs[:0])
	if qs[0].Later != 0 || qs[0].Count != 151 {
		t.Errorf("Later/Count after the window = %v/%v, want 0/151", qs[0].Later, qs[0].Count)
	}
	if math.Abs(qs[0].Cap-wantCap) > 1 {
		t.Errorf("Cap = %v, a decision's cap %v", qs[0].Cap, wantCap)
	}
}

// TestReportScopes: local limits are neither counted nor described, only reported as
// other; a request matching no rule has no quota.
func TestReportScopes(t *testing.T) {
	l, clk := newLimiter(t, localRules, nil)
	ctx := context.Background()
	qs, other := l.Reporter(Request{Domain: "api", Descriptors: [][]rules.Entry{desc("user", "1")}}).Report(ctx, clk.Now(), 5, 0, time.Second, nil)
	if len(qs) != 0 || other != 2 {
		t.Errorf("local rule: %d quotas, %d other; want 0, 2", len(qs), other)
	}
	var res Result
	l.DecideAt(ctx, clk.Now(), Request{Domain: "api", Descriptors: [][]rules.Entry{desc("user", "1")}}, &res)
	if res.Statuses[0].Remaining != 2 {
		t.Errorf("local limit after a report: remaining %d, want 2 (the report took nothing)", res.Statuses[0].Remaining)
	}
	qs, other = l.Reporter(Request{Domain: "api", Descriptors: [][]rules.Entry{desc("nothing", "1")}}).Report(ctx, clk.Now(), 5, 0, time.Second, nil)
	if len(qs) != 0 || other != 0 {
		t.Errorf("no rule: %d quotas, %d other", len(qs), other)
	}
}
