package aggregator

import (
	"errors"
	"math"
	"reflect"
	"testing"
	"time"

	"github.com/streamlimit/streamlimit/internal/windowref"
	"github.com/streamlimit/streamlimit/topics"
	"github.com/streamlimit/streamlimit/window"
)

func TestMemoryCountsLikeTheReference(t *testing.T) {
	m, err := NewMemory(Config{})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	const key = "api|user=1#10s"
	var hits []topics.Hit
	for i := range 30 {
		h := topics.Hit{Key: key, Site: []string{"eu", "us"}[i%2], BucketStart: t0.UnixMilli() + int64(i)*300, Window: 10000, Count: int64(1 + i%3)}
		hits = append(hits, h)
		if err := m.Add(t0.Add(time.Duration(i)*300*time.Millisecond), h); err != nil {
			t.Fatal(err)
		}
	}
	now := t0.Add(12 * time.Second)
	out := m.Emit(now)
	if len(out) != 2 {
		t.Fatalf("want one count and one heartbeat, got %d records", len(out))
	}
	c, err := topics.DecodeCount(out[0].Value)
	if err != nil || string(out[0].Key) != key {
		t.Fatalf("count record %q: %v", out[0].Key, err)
	}
	want, sites := windowref.Reference(window.NewSpec(10*time.Second, 60, 30*time.Second), hits, now.UnixMilli())
	if c.Total != want || c.Site("eu") != sites["eu"] || c.Site("us") != sites["us"] || c.AsOf != now.UnixMilli() {
		t.Fatalf("count %+v, want total %v sites %v as of %d", c, want, sites, now.UnixMilli())
	}
	hb, err := topics.DecodeHeartbeat(out[1].Value)
	if err != nil || string(out[1].Key) != topics.HeartbeatKey(topics.DefaultHitsTopic, 0) || hb.AsOf != now.UnixMilli() || hb.Offset != 30 {
		t.Fatalf("heartbeat %q %+v: %v", out[1].Key, hb, err)
	}
	// Nothing changed 100 ms later, and the heartbeat is not due yet.
	if out := m.Emit(now.Add(100 * time.Millisecond)); len(out) != 0 && out[0].Value != nil {
		if got, _ := topics.DecodeCount(out[0].Value); got.Total == c.Total {
			t.Fatalf("unchanged count re-emitted: %+v", out)
		}
	}
	// Once every hit has left the window the key gets a tombstone and is forgotten.
	late := t0.Add(30 * time.Second)
	out = m.Emit(late)
	if len(out) != 2 || out[0].Value != nil || string(out[0].Key) != key || m.Keys() != 0 {
		t.Fatalf("want a tombstone and a heartbeat, got %d records, keys %d", len(out), m.Keys())
	}
}

func TestMemoryRejectsLikeKafkaPath(t *testing.T) {
	m, err := NewMemory(Config{MaxKeys: 1})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ms := now.UnixMilli()
	for _, tc := range []struct {
		hit    topics.Hit
		reason string
	}{
		{topics.Hit{Key: "", Site: "eu", BucketStart: ms, Window: 1000, Count: 1}, topics.Reason(topics.ErrEmptyKey)},
		{topics.Hit{Key: "k", Site: "eu", BucketStart: ms + time.Minute.Milliseconds(), Window: 1000, Count: 1}, ReasonTooFarFuture},
		{topics.Hit{Key: "k", Site: "eu", BucketStart: ms - time.Minute.Milliseconds(), Window: 1000, Count: 1}, ReasonTooOld},
		{topics.Hit{Key: "k", Site: "eu", BucketStart: ms, Window: 2 * time.Hour.Milliseconds(), Count: 1}, ReasonWindowTooLong},
	} {
		var bad *BadHitError
		if err := m.Add(now, tc.hit); !errors.As(err, &bad) || bad.Reason != tc.reason {
			t.Errorf("%+v: got %v, want reason %s", tc.hit, err, tc.reason)
		}
	}
	if err := m.Add(now, topics.Hit{Key: "a", Site: "eu", BucketStart: ms, Count: 1}); err != nil {
		t.Fatal(err) // window 0: the default window applies
	}
	// A second key beyond MaxKeys 1 takes the first one's place.
	if err := m.Add(now, topics.Hit{Key: "b", Site: "eu", BucketStart: ms, Count: 1}); err != nil || m.Keys() != 1 {
		t.Fatalf("second key beyond MaxKeys 1: %v, %d keys", err, m.Keys())
	}
	if _, err := NewMemory(Config{EmitInterval: time.Microsecond}); err == nil {
		t.Fatal("EmitInterval 1µs accepted")
	}
}

// emitted decodes the counts and the heartbeat of one Emit.
func emitted(t *testing.T, out []Emission) (map[string]topics.Count, *topics.Heartbeat) {
	t.Helper()
	cs := map[string]topics.Count{}
	var hb *topics.Heartbeat
	for _, e := range out {
		switch {
		case topics.IsHeartbeatKey(e.Key):
			h, err := topics.DecodeHeartbeat(e.Value)
			if err != nil {
				t.Fatal(err)
			}
			hb = &h
		case e.Value != nil:
			c, err := topics.DecodeCount(e.Value)
			if err != nil {
				t.Fatal(err)
			}
			cs[c.Key] = c
		}
	}
	return cs, hb
}

// A site that sends site heartbeats has its heartbeat time published, per partition, in
// the aggregator's heartbeats; after SiteForget it is no longer listed, and once its hits
// have left the window its key goes.
func TestMemorySiteFreshness(t *testing.T) {
	m, err := NewMemory(Config{SiteForget: time.Minute, HeartbeatInterval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ms := t0.UnixMilli()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(m.Add(t0, topics.Hit{Key: "k", Site: "eu", BucketStart: ms, Window: 10_000, Count: 6}))
	must(m.Add(t0, topics.Hit{Key: "k", Site: "us", BucketStart: ms + 5000, Window: 10_000, Count: 4}))
	must(m.Add(t0.Add(2*time.Second), topics.Hit{Key: topics.SiteHeartbeatKey, Site: "us", BucketStart: ms + 2000}))
	must(m.Add(t0.Add(2*time.Second), topics.Hit{Key: topics.SiteHeartbeatKey, Site: "us", BucketStart: ms + 1500})) // older: ignored
	// 10.1 s later eu's hits have left the window; us's, stamped at +5 s, have not.
	cs, hb := emitted(t, m.Emit(t0.Add(10_100*time.Millisecond)))
	c := cs["k"]
	if c.Site("eu") != 0 || c.Site("us") != 4 || c.Total != 4 || c.SubBuckets != window.DefaultSubBuckets {
		t.Fatalf("count %+v", c)
	}
	if hb == nil || hb.Sites["us"] != ms+2000 || len(hb.Sites) != 1 {
		t.Fatalf("heartbeat %+v", hb)
	}
	// Past SiteForget, us is no longer listed; once its hits have left, the key goes.
	out := m.Emit(t0.Add(63 * time.Second))
	if _, hb := emitted(t, out); hb == nil || len(hb.Sites) != 0 {
		t.Fatalf("heartbeat after SiteForget: %+v", hb)
	}
	if m.Keys() != 0 {
		t.Fatalf("keys %d after every hit left", m.Keys())
	}
	// A heartbeat older than SiteForget or far ahead is bad.
	for _, ts := range []int64{ms, ms + 200_000} {
		var bad *BadHitError
		if err := m.Add(t0.Add(70*time.Second), topics.Hit{Key: topics.SiteHeartbeatKey, Site: "us", BucketStart: ts}); !errors.As(err, &bad) {
			t.Fatalf("heartbeat at %d: %v", ts, err)
		}
	}
}

// Denied requests publish demand, not counts: a site whose requests were all denied is
// listed with count 0 and its demand.
func TestMemoryDemand(t *testing.T) {
	m, err := NewMemory(Config{})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ms := t0.UnixMilli()
	if err := m.Add(t0, topics.Hit{Key: "k", Site: "eu", BucketStart: ms, Window: 60_000, Count: 10}); err != nil {
		t.Fatal(err)
	}
	if err := m.Add(t0, topics.Hit{Key: "k", Site: "us", BucketStart: ms + 1000, Window: 60_000, Denied: 5}); err != nil {
		t.Fatal(err)
	}
	cs, _ := emitted(t, m.Emit(t0.Add(2*time.Second)))
	c := cs["k"]
	if c.Total != 10 || len(c.Sites) != 2 || c.Sites[1].Site != "us" || c.Sites[1].Count != 0 {
		t.Fatalf("count %+v", c)
	}
	eu, us := c.Sites[0].Demand, c.Sites[1].Demand
	if want := 10 * math.Exp(-2); math.Abs(eu-want) > 1e-9 {
		t.Fatalf("eu demand %v, want %v", eu, want)
	}
	if want := 5 * math.Exp(-1); math.Abs(us-want) > 1e-9 {
		t.Fatalf("us demand %v, want %v", us, want)
	}
}

// Two live instances of one site counting apart, one in its own process, are reported in
// the heartbeats; instances sharing one Redis are not; an instance gone quiet is forgotten.
func TestMemorySiteConflicts(t *testing.T) {
	m, err := NewMemory(Config{HeartbeatInterval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	hb := func(at time.Time, site, inst, counter string) {
		t.Helper()
		if err := m.Add(at, topics.Hit{Key: topics.SiteHeartbeatKey, Site: site, BucketStart: at.UnixMilli(), Instance: inst, Counter: counter}); err != nil {
			t.Fatal(err)
		}
	}
	hb(t0, "eu", "a", "process:a")
	hb(t0, "eu", "b", "process:b")
	hb(t0, "us", "c", "redis:r1")
	hb(t0, "us", "d", "redis:r1")
	_, got := emitted(t, m.Emit(t0.Add(time.Second)))
	if got == nil || len(got.Conflicts) != 1 || got.Conflicts[0] != "eu" {
		t.Fatalf("heartbeat %+v, want conflicts [eu]", got)
	}
	// b stops: 11 s later only a is live.
	hb(t0.Add(11*time.Second), "eu", "a", "process:a")
	if _, got = emitted(t, m.Emit(t0.Add(11*time.Second))); got == nil || len(got.Conflicts) != 0 {
		t.Fatalf("heartbeat %+v after b went quiet, want no conflicts", got)
	}
	// a stops cleanly (its leave record) and a new instance of eu, in its own process,
	// starts at once: a restart under the site's name, not two instances counting apart.
	t1 := t0.Add(12 * time.Second)
	if err := m.Add(t1, topics.Hit{Key: topics.SiteLeaveKey, Site: "eu", BucketStart: t1.UnixMilli(), Instance: "a", Counter: "process:a"}); err != nil {
		t.Fatal(err)
	}
	hb(t1.Add(100*time.Millisecond), "eu", "e", "process:e")
	if _, got = emitted(t, m.Emit(t1.Add(time.Second))); got == nil || len(got.Conflicts) != 0 {
		t.Fatalf("heartbeat %+v after a left and e started, want no conflicts", got)
	}
}

// An instance is live as of its heartbeat's date: a heartbeat of an instance that stopped
// without a leave (a crash), written again long after by someone who can read the topic,
// does not bring it back as a second instance counting apart from the one that replaced
// it. Before, the instance was live as of the reading and the site was reported in conflict
// for instanceWindow after every replay.
func TestMemoryConflictsIgnoreReplayedHeartbeats(t *testing.T) {
	m, err := NewMemory(Config{HeartbeatInterval: time.Millisecond, MaxClockSkew: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	hb := func(read, dated time.Time, inst string) {
		t.Helper()
		if err := m.Add(read, topics.Hit{Key: topics.SiteHeartbeatKey, Site: "eu", BucketStart: dated.UnixMilli(), Instance: inst, Counter: "process:" + inst}); err != nil {
			t.Fatal(err)
		}
	}
	hb(t0, t0, "b") // b crashes after this heartbeat
	for at := 20 * time.Second; at <= 40*time.Second; at += 500 * time.Millisecond {
		now := t0.Add(at)
		hb(now, now, "a")
		hb(now, t0, "b") // b's last heartbeat, replayed
		if _, got := emitted(t, m.Emit(now.Add(time.Millisecond))); got == nil || len(got.Conflicts) != 0 {
			t.Fatalf("at %v, heartbeat %+v: want no conflicts from a replayed heartbeat", at, got)
		}
	}
	// b's clock a little ahead of this aggregator's is still b alive, and two live
	// instances counting apart are still a conflict.
	now := t0.Add(41 * time.Second)
	hb(now, now.Add(300*time.Millisecond), "b")
	if _, got := emitted(t, m.Emit(now.Add(time.Millisecond))); got == nil || len(got.Conflicts) != 1 {
		t.Fatalf("heartbeat %+v, want conflicts [eu] once b heartbeats again", got)
	}
}

// Local hits are held back by the difference between the replicated hits' lag and the
// local ones', so that the counts show every site as of about the same moment; with
// MaxLocalHold negative they are counted at once.
func TestMemoryHoldsLocalHitsBehindRemote(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name    string
		maxHold time.Duration
		visible time.Duration // when the local hit first shows in the counts
	}{
		{"held", 0, 195 * time.Millisecond},
		{"bounded", 50 * time.Millisecond, 50 * time.Millisecond},
		{"off", -1, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := NewMemory(Config{MaxLocalHold: tc.maxHold, EmitInterval: time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			// Warm the lag estimates: replicated hits arrive 200 ms after their bucket
			// starts, local ones 5 ms after.
			now := t0
			for i := range 100 {
				now = t0.Add(time.Duration(i) * 10 * time.Millisecond)
				ms := now.UnixMilli()
				if err := m.AddFrom(now, "us.hits", topics.Hit{Key: "r", Site: "us", BucketStart: ms - 200, Window: 60_000, Count: 1}); err != nil {
					t.Fatal(err)
				}
				if err := m.Add(now, topics.Hit{Key: "l", Site: "eu", BucketStart: ms - 5, Window: 60_000, Count: 1}); err != nil {
					t.Fatal(err)
				}
			}
			at := now.Add(10 * time.Second) // past every warm-up hold
			if err := m.Add(at, topics.Hit{Key: "x", Site: "eu", BucketStart: at.UnixMilli() - 5, Window: 60_000, Count: 3}); err != nil {
				t.Fatal(err)
			}
			if tc.visible > 0 {
				cs, _ := emitted(t, m.Emit(at.Add(tc.visible-10*time.Millisecond)))
				if c, ok := cs["x"]; ok {
					t.Fatalf("local hit counted %v after it came, before its hold: %+v", tc.visible-10*time.Millisecond, c)
				}
			}
			cs, _ := emitted(t, m.Emit(at.Add(tc.visible+10*time.Millisecond)))
			if c := cs["x"]; c.Total != 3 {
				t.Fatalf("local hit not counted %v after it came: %+v", tc.visible+10*time.Millisecond, cs["x"])
			}
		})
	}
}

// With CountsFormat json the count records are the JSON form, decoded to the same count
// as the binary ones; an unknown format is refused.
func TestMemoryCountsFormatJSON(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	counts := map[string]map[string]topics.Count{}
	for _, format := range []string{CountsBinary, CountsJSON} {
		m, err := NewMemory(Config{CountsFormat: format})
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Add(t0, topics.Hit{Key: "api|user=1#60s", Site: "eu", BucketStart: t0.UnixMilli(), Window: 60_000, Count: 3}); err != nil {
			t.Fatal(err)
		}
		for _, e := range m.Emit(t0.Add(time.Second)) {
			if topics.IsReservedKey(e.Key) {
				continue
			}
			if json := e.Value[0] == '{'; json != (format == CountsJSON) {
				t.Fatalf("%s: value %q", format, e.Value)
			}
			c, err := topics.DecodeCount(e.Value)
			if err != nil {
				t.Fatalf("%s: %v", format, err)
			}
			if counts[format] == nil {
				counts[format] = map[string]topics.Count{}
			}
			counts[format][string(e.Key)] = c
		}
	}
	b, j := counts[CountsBinary]["api|user=1#60s"], counts[CountsJSON]["api|user=1#60s"]
	if b.Total != 3 || !reflect.DeepEqual(b, j) {
		t.Fatalf("binary %+v, json %+v", b, j)
	}
	if _, err := NewMemory(Config{CountsFormat: "avro"}); err == nil {
		t.Fatal("unknown CountsFormat accepted")
	}
}
