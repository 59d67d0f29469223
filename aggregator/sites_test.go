package aggregator

import (
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/streamlimit/streamlimit/topics"
)

// heartbeats returns the heartbeats of out by topic.
func heartbeats(t *testing.T, out []Emission) map[string]topics.Heartbeat {
	t.Helper()
	hbs := map[string]topics.Heartbeat{}
	for _, e := range out {
		if topics.IsHeartbeatKey(e.Key) {
			h, err := topics.DecodeHeartbeat(e.Value)
			if err != nil {
				t.Fatal(err)
			}
			hbs[h.Topic] = h
		}
	}
	return hbs
}

// A site is left once every instance heard from on a source has left: one instance of two
// leaving keeps it live, the last one makes it left (listed with the time it left, no
// longer with a heartbeat time), and a heartbeat under its name (a restart) makes it live
// again. Sites are listed per source topic.
func TestMemorySiteLeaves(t *testing.T) {
	m, err := NewMemory(Config{HeartbeatInterval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ms := t0.UnixMilli()
	add := func(at time.Duration, topic, key, site, inst string, ts int64) {
		t.Helper()
		if err := m.AddFrom(t0.Add(at), topic, topics.Hit{Key: key, Site: site, BucketStart: ts, Instance: inst}); err != nil {
			t.Fatal(err)
		}
	}
	emit := func(at time.Duration) map[string]topics.Heartbeat {
		t.Helper()
		return heartbeats(t, m.Emit(t0.Add(at)))
	}
	add(0, "hits", topics.SiteHeartbeatKey, "eu", "a", ms)
	add(0, "hits", topics.SiteHeartbeatKey, "eu", "b", ms)
	add(0, "us.hits", topics.SiteHeartbeatKey, "us", "u", ms)
	add(100*time.Millisecond, "hits", topics.SiteLeaveKey, "eu", "a", ms+100)
	hbs := emit(200 * time.Millisecond)
	if hb := hbs["hits"]; hb.Sites["eu"] != ms || len(hb.Left) != 0 || hb.Sites["us"] != 0 {
		t.Fatalf("one instance of two left: hits heartbeat %+v, want eu live", hb)
	}
	if hb := hbs["us.hits"]; hb.Sites["us"] != ms || len(hb.Sites) != 1 {
		t.Fatalf("us.hits heartbeat %+v, want us alone", hb)
	}
	add(300*time.Millisecond, "hits", topics.SiteLeaveKey, "eu", "b", ms+300)
	if hb := emit(400 * time.Millisecond)["hits"]; hb.Left["eu"] != ms+300 || len(hb.Sites) != 0 {
		t.Fatalf("every instance left: heartbeat %+v, want eu left at %d", hb, ms+300)
	}
	add(500*time.Millisecond, "hits", topics.SiteHeartbeatKey, "eu", "c", ms+500)
	if hb := emit(600 * time.Millisecond)["hits"]; hb.Sites["eu"] != ms+500 || len(hb.Left) != 0 {
		t.Fatalf("restarted: heartbeat %+v, want eu live again", hb)
	}
	// An instance silent for longer than instanceLive does not keep its site live when the
	// last speaking one leaves (it stopped without a leave record).
	add(5*time.Second, "hits", topics.SiteHeartbeatKey, "eu", "d", ms+5000)
	add(5100*time.Millisecond, "hits", topics.SiteLeaveKey, "eu", "d", ms+5100)
	if hb := emit(5200 * time.Millisecond)["hits"]; hb.Left["eu"] != ms+5100 {
		t.Fatalf("the speaking instance left: heartbeat %+v, want eu left", hb)
	}
	if got := testutil.ToFloat64(m.m.siteLeaves); got != 3 {
		t.Fatalf("site_leaves_total = %v, want 3", got)
	}
}

// A site's leave is listed only once the counts of its last hits are out: not while a
// counter that its hits made dirty waits for its emission interval, nor while counters
// wait in the backlog of a round over its budget, unless that lasts leaveHoldRounds
// intervals. Until then the site is listed live.
func TestLeaveWaitsForTheSitesLastCounts(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ms := t0.UnixMilli()
	// start returns a Memory emitting every 100 ms with a budget of one count a round,
	// and its add (a hit of key from site eu, or a site record) and round (the keys counted
	// at at, and whether the heartbeat lists eu as left; a count after the heartbeat, or a
	// heartbeat that does not list eu one way or the other, fails).
	start := func(t *testing.T) (add func(at time.Duration, key string), round func(at time.Duration) ([]string, bool)) {
		m, err := NewMemory(Config{HeartbeatInterval: time.Millisecond, EmitInterval: 100 * time.Millisecond, MaxEmitPerSecond: 10})
		if err != nil {
			t.Fatal(err)
		}
		add = func(at time.Duration, key string) {
			t.Helper()
			h := topics.Hit{Key: key, Site: "eu", BucketStart: ms + at.Milliseconds(), Window: 60_000, Count: 1}
			if key == topics.SiteHeartbeatKey || key == topics.SiteLeaveKey {
				h.Window, h.Count, h.Instance = 0, 0, "a"
			}
			if err := m.AddFrom(t0.Add(at), "hits", h); err != nil {
				t.Fatal(err)
			}
		}
		round = func(at time.Duration) (counted []string, left bool) {
			t.Helper()
			hb := false
			for _, e := range m.Emit(t0.Add(at)) {
				if !topics.IsHeartbeatKey(e.Key) {
					if hb {
						t.Fatalf("at %v: count of %s after the heartbeat", at, e.Key)
					}
					counted = append(counted, string(e.Key))
					continue
				}
				hb = true
				h, err := topics.DecodeHeartbeat(e.Value)
				if err != nil {
					t.Fatal(err)
				}
				_, live := h.Sites["eu"]
				_, left = h.Left["eu"]
				if live == left {
					t.Fatalf("at %v: heartbeat %+v lists eu live %v and left %v", at, h, live, left)
				}
			}
			if !hb {
				t.Fatalf("at %v: no heartbeat", at)
			}
			return counted, left
		}
		add(0, topics.SiteHeartbeatKey)
		return add, round
	}
	check := func(t *testing.T, at time.Duration, gotKeys []string, gotLeft bool, wantKeys int, wantLeft bool) {
		t.Helper()
		if len(gotKeys) != wantKeys || gotLeft != wantLeft {
			t.Fatalf("at %v: counted %v and listed the leave %v; want %d counts and %v", at, gotKeys, gotLeft, wantKeys, wantLeft)
		}
	}

	t.Run("interval", func(t *testing.T) {
		add, round := start(t)
		add(0, "k1")
		got, left := round(0)
		check(t, 0, got, left, 1, false)
		// k1 was published at 0, so its next hit is due at 100 ms; k2 is new, due at once.
		add(10*time.Millisecond, "k1")
		add(10*time.Millisecond, "k2")
		add(20*time.Millisecond, topics.SiteLeaveKey)
		got, left = round(30 * time.Millisecond)
		check(t, 30*time.Millisecond, got, left, 1, false)
		got, left = round(120 * time.Millisecond)
		check(t, 120*time.Millisecond, got, left, 1, true)
	})
	t.Run("backlog", func(t *testing.T) {
		add, round := start(t)
		for _, k := range []string{"k1", "k2", "k3"} {
			add(0, k)
		}
		add(0, topics.SiteLeaveKey)
		for i, wantLeft := range []bool{false, false, true} {
			at := time.Duration(i+1) * 100 * time.Millisecond
			got, left := round(at)
			check(t, at, got, left, 1, wantLeft)
		}
	})
	t.Run("overload", func(t *testing.T) {
		// A backlog of 3 × leaveHoldRounds rounds: the leave is listed after
		// leaveHoldRounds, counts still waiting.
		add, round := start(t)
		for i := range 3 * leaveHoldRounds {
			add(0, "k"+strconv.Itoa(i))
		}
		add(0, topics.SiteLeaveKey)
		for i := 1; i <= leaveHoldRounds; i++ {
			at := time.Duration(i) * 100 * time.Millisecond
			got, left := round(at)
			check(t, at, got, left, 1, i == leaveHoldRounds)
		}
	})
}

// A site cut off from the aggregator (silent, and so is every other site of its source)
// is counted as of its last heartbeat, its hits still counting while they cannot be seen
// leaving; a site silent while another of its source still speaks (a crash) is counted
// now, and its hits leave the window.
func TestMemoryCountsACutSiteAsOfItsLastHeartbeat(t *testing.T) {
	for _, tc := range []struct {
		name      string
		neighbour bool // us2 keeps speaking on us.hits
		want      float64
	}{
		{"cut", false, 5},
		{"crashed", true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := NewMemory(Config{HeartbeatInterval: time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			ms := t0.UnixMilli()
			add := func(at time.Duration, h topics.Hit) {
				t.Helper()
				if err := m.AddFrom(t0.Add(at), "us.hits", h); err != nil {
					t.Fatal(err)
				}
			}
			add(0, topics.Hit{Key: topics.SiteHeartbeatKey, Site: "us", BucketStart: ms})
			add(100*time.Millisecond, topics.Hit{Key: "k", Site: "us", BucketStart: ms + 100, Window: 10_000, Count: 5})
			// Heartbeats go on past the window: eu (local) always, us2 when a neighbour.
			for at := time.Second; at <= 12*time.Second; at += time.Second {
				if err := m.Add(t0.Add(at), topics.Hit{Key: topics.SiteHeartbeatKey, Site: "eu", BucketStart: ms + at.Milliseconds()}); err != nil {
					t.Fatal(err)
				}
				if tc.neighbour {
					add(at, topics.Hit{Key: topics.SiteHeartbeatKey, Site: "us2", BucketStart: ms + at.Milliseconds()})
				}
			}
			cs, _ := emitted(t, m.Emit(t0.Add(12*time.Second)))
			c, ok := cs["k"]
			if got := c.Site("us"); got != tc.want || (tc.want == 0 && ok && c.Total != 0) {
				t.Fatalf("us counted %v 12 s after its last hit (window 10 s), want %v (%+v)", got, tc.want, cs)
			}
		})
	}
}
