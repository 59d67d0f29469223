package demo

import (
	"context"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/streamlimit/streamlimit/internal/testenv"
)

// TestDemoGlobalLimitHolds runs the whole demo for 10 s on the embedded broker and checks
// the product's point: the abusive client, spread over three sites, gets about its global
// limit per window (not starved, not 3×), and light clients are never denied.
//
// It runs in a testing/synctest bubble, the broker's connections in memory: time moves
// only when every goroutine of the demo waits, so the verdict is the same on a busy
// machine as on an idle one.
func TestDemoGlobalLimitHolds(t *testing.T) {
	synctest.Test(t, testDemoGlobalLimitHolds)
}

func testDemoGlobalLimitHolds(t *testing.T) {
	var out testenv.SyncBuffer
	var network kfake.VirtualNetwork
	sum, err := Run(context.Background(), Options{Duration: 10 * time.Second, Seed: 1, Network: &network}, &out)
	t.Logf("output:\n%s", out.String())
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	ws := sum.AbusiveWindows
	if !ws.Measured() {
		t.Fatalf("no window measured: %+v", ws)
	}
	t.Logf("abusive max %d (%.1f%%), mean %.1f (%.1f%%) of limit %d; lag %+v",
		ws.Max, sum.MaxPercent(), ws.Mean, sum.MeanPercent(), sum.Limit, sum.Lag)
	limit := float64(sum.Limit)
	if float64(ws.Max) > 1.05*limit {
		t.Errorf("abusive client got %d in one window, over 105%% of the limit %d", ws.Max, sum.Limit)
	}
	if float64(ws.Max) < 0.95*limit {
		t.Errorf("abusive client got at most %d in a window, under 95%% of the limit %d: starved", ws.Max, sum.Limit)
	}
	if sum.LightDenied != 0 || sum.LightRequests == 0 {
		t.Errorf("light clients: %d denied of %d requests", sum.LightDenied, sum.LightRequests)
	}
	if !sum.Held || !strings.Contains(out.String(), "VERDICT: the global limit HELD") {
		t.Errorf("summary lacks the verdict that the limit held")
	}
}

// TestDemoInterrupted cancels the run during the traffic, as Ctrl-C does: the demo shuts
// down cleanly and summarises what ran, without claiming a verdict it could not measure.
func TestDemoInterrupted(t *testing.T) {
	synctest.Test(t, testDemoInterrupted)
}

func testDemoInterrupted(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out testenv.SyncBuffer
	var network kfake.VirtualNetwork
	done := make(chan struct{})
	var (
		sum Summary
		err error
	)
	go func() {
		defer close(done)
		sum, err = Run(ctx, Options{Duration: time.Minute, Sites: 2, Network: &network}, &out)
	}()
	// Cancel once traffic has produced decisions (the first status line is at 2 s).
	for deadline := time.Now().Add(60 * time.Second); ; {
		select {
		case <-done:
			t.Fatalf("Run ended before it was cancelled: %v\n%s", err, out.String())
		case <-time.After(50 * time.Millisecond):
		}
		if strings.Contains(out.String(), "admitted/denied") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no status line:\n%s", out.String())
		}
	}
	cancel()
	<-done
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if !sum.Interrupted || sum.Held || sum.AbusiveWindows.Measured() {
		t.Fatalf("summary %+v", sum)
	}
	if len(sum.Sites) != 2 || sum.Sites[0].Admitted+sum.Sites[0].Denied == 0 {
		t.Fatalf("sites %+v", sum.Sites)
	}
	for _, want := range []string{"Summary interrupted after", "VERDICT: NOT MEASURED"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}
