package snapshot

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/streamlimit/streamlimit/topics"
)

// TestClockSkew: the heartbeats tell how far this process's clock is at least off the
// aggregators'. A heartbeat written 2 s after the time it is applied here (AsOf ahead of
// this clock) shows this clock 2 s behind; one whose time of this site's hits is 3 s after
// its AsOf shows this site's clock 3 s ahead. Past Config.MaxCountAhead (1 s) CheckClock
// fails, the gauges say how far, and one warning is logged however many heartbeats come;
// delays of the pipeline (a heartbeat 300 ms old, this site's hits counted up to 400 ms
// before it) show no skew; and the evidence ages out 30 s after a clock is put right.
func TestClockSkew(t *testing.T) {
	var logs bytes.Buffer
	f := newFixture(t, Config{Site: "eu", Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	apply := func(asOf time.Time, mine time.Duration) {
		t.Helper()
		h := topics.Heartbeat{Instance: "agg-1", Topic: "hits", Partition: 0, AsOf: asOf.UnixMilli(),
			Sites: map[string]int64{"eu": asOf.Add(mine).UnixMilli(), "us": asOf.UnixMilli()}}
		v, err := h.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		_ = f.s.Apply([]byte(topics.HeartbeatKey("hits", 0)), v) // a count from the future is refused; the heartbeat is applied
	}
	check := func(what string, wantAhead, wantBehind time.Duration, wantOK bool) {
		t.Helper()
		ahead, behind := f.s.ClockSkew()
		err := f.s.CheckClock()
		if ahead != wantAhead || behind != wantBehind || (err == nil) != wantOK || (err != nil && !errors.Is(err, ErrClockSkew)) {
			t.Errorf("%s: ahead %v behind %v, CheckClock %v; want ahead %v behind %v, ok %v", what, ahead, behind, err, wantAhead, wantBehind, wantOK)
		}
		if a, b := f.metric(t, "streamlimit_snapshot_clock_ahead_seconds"), f.metric(t, "streamlimit_snapshot_clock_behind_seconds"); a != ahead.Seconds() || b != behind.Seconds() {
			t.Errorf("%s: gauges ahead %v behind %v", what, a, b)
		}
	}

	for range 10 {
		f.clk.Advance(500 * time.Millisecond)
		apply(f.clk.Now().Add(-300*time.Millisecond), -400*time.Millisecond)
	}
	check("clocks that agree", 0, 0, true)

	for range 10 {
		f.clk.Advance(500 * time.Millisecond)
		apply(f.clk.Now().Add(2*time.Second), -400*time.Millisecond)
	}
	check("this clock 2 s behind", 0, 2*time.Second, false)
	if err := f.s.CheckClock(); err == nil || !strings.Contains(err.Error(), "at least 2s behind them (bound 1s)") {
		t.Errorf("CheckClock: %v", err)
	}
	if n := strings.Count(logs.String(), "clock is off"); n != 1 {
		t.Errorf("%d warnings in 5 s of heartbeats, want 1:\n%s", n, logs.String())
	}

	f.clk.Advance(31 * time.Second)
	apply(f.clk.Now().Add(-300*time.Millisecond), 3*time.Second)
	check("this site's clock 3 s ahead, the old evidence gone", 3*time.Second, 0, false)
	if err := f.s.CheckClock(); err == nil || !strings.Contains(err.Error(), "ahead of them") {
		t.Errorf("CheckClock: %v", err)
	}

	for range 62 {
		f.clk.Advance(500 * time.Millisecond)
		apply(f.clk.Now().Add(-300*time.Millisecond), -400*time.Millisecond)
	}
	check("30 s after the clock was put right", 0, 0, true)
}

// A clock ahead by more than topics.MaxSiteRecordAhead leaves no heartbeat evidence: the
// aggregators refuse the site's heartbeats as dated ahead, and no heartbeat lists the
// site. Counts still show its hits; after 10 s of that with no heartbeat listing the site,
// CheckClock fails (ErrClockSkew), and passes again once one does. A process whose counts
// show its site before its own first heartbeats are listed (a restart) is not taken for
// one.
func TestClockAheadPastSiteRecordBound(t *testing.T) {
	f := newFixture(t, Config{Site: "eu"})
	step := func(listEU bool) {
		t.Helper()
		f.clk.Advance(500 * time.Millisecond)
		now := f.clk.Now().UnixMilli()
		sites := map[string]int64{"us": now - 200}
		if listEU {
			sites["eu"] = now - 100
		}
		h := topics.Heartbeat{Instance: "agg-1", Topic: "hits", Partition: 0, AsOf: now - 50, Sites: sites}
		v, err := h.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		if err := f.s.Apply([]byte(topics.HeartbeatKey("hits", 0)), v); err != nil {
			t.Fatal(err)
		}
		c := topics.Count{Key: "k", Window: 60_000, AsOf: now - 50, Total: 7, Sites: []topics.SiteCount{{Site: "eu", Count: 4}, {Site: "us", Count: 3}}}
		if v, err = c.MarshalBinary(); err != nil {
			t.Fatal(err)
		}
		if err := f.s.Apply([]byte("k"), v); err != nil {
			t.Fatal(err)
		}
	}
	// A restart: counts show eu for a second before its heartbeats are listed.
	for i := range 40 {
		step(i >= 2)
		if err := f.s.CheckClock(); err != nil {
			t.Fatalf("step %d, eu listed: %v", i, err)
		}
	}
	// eu's heartbeats are refused from now on.
	for i := range 19 {
		step(false)
		if err := f.s.CheckClock(); err != nil {
			t.Fatalf("%d ms unlisted: %v", 500*(i+1), err)
		}
	}
	step(false)
	err := f.s.CheckClock()
	if !errors.Is(err, ErrClockSkew) || !strings.Contains(err.Error(), "no aggregator heartbeat has listed it") {
		t.Fatalf("10 s counted and unlisted: CheckClock %v", err)
	}
	step(true)
	if err := f.s.CheckClock(); err != nil {
		t.Fatalf("listed again: %v", err)
	}
}
