package aggregator

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/streamlimit/streamlimit/topics"
)

// hour is the window of the tests' long rules (a 5-per-hour limit).
const hour = time.Hour / time.Millisecond

// A table full of counters hit long ago still counts a new key: it takes the place of the
// least recently hit, is published at the next emission, and the eviction is counted. A
// table that refused new keys (as it did) left them with no global count at all: each
// site decided them alone.
func TestFullTableCountsNewKey(t *testing.T) {
	const maxKeys = 1000
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	m, reg := tableOfOldKeys(t, maxKeys, maxKeys, t0)
	m.Emit(t0)
	// Half an hour later, every old counter still counts its hit; the table is full.
	now := t0.Add(30 * time.Minute)
	for k := range 3 {
		key := fmt.Sprintf("new-%d", k)
		if err := m.Add(now, topics.Hit{Key: key, Site: "eu", BucketStart: now.UnixMilli(), Window: int64(hour), Count: 2}); err != nil {
			t.Fatalf("%s in a full table: %v", key, err)
		}
	}
	if m.Keys() != maxKeys {
		t.Fatalf("%d counters held, want MaxKeys %d", m.Keys(), maxKeys)
	}
	if got := metricValue(t, reg, "streamlimit_aggregator_evicted_keys_total"); got != 3 {
		t.Errorf("evicted_keys_total %v, want 3", got)
	}
	if got := metricValue(t, reg, "streamlimit_aggregator_refused_keys_total"); got != 0 {
		t.Errorf("refused_keys_total %v, want 0", got)
	}
	cs, _ := emitted(t, m.Emit(now.Add(100*time.Millisecond)))
	for k := range 3 {
		key := fmt.Sprintf("new-%d", k)
		if c, ok := cs[key]; !ok || c.Total != 2 {
			t.Errorf("%s published as %+v (%v), want a count of 2", key, c, ok)
		}
	}
	// A second hit of a new key adds to its counter: it was kept, not refused again.
	later := now.Add(time.Second)
	if err := m.Add(later, topics.Hit{Key: "new-0", Site: "eu", BucketStart: later.UnixMilli(), Window: int64(hour), Count: 1}); err != nil {
		t.Fatal(err)
	}
	cs, _ = emitted(t, m.Emit(later.Add(100*time.Millisecond)))
	if c := cs["new-0"]; c.Total != 3 {
		t.Errorf("new-0 published as %+v, want 3", c)
	}
}

// Eviction takes the least recently hit: a 5-per-hour client at its limit, hit after the
// other counters were, keeps its count through a flood of new keys, and its next hit is
// published on top of the 5 (a counter evicted and made again would publish 1: the client
// would get its hour's limit again).
func TestFullTableKeepsRecentlyHitLongWindow(t *testing.T) {
	const maxKeys = 100
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	m, reg := tableOfOldKeys(t, maxKeys, maxKeys-1, t0.Add(-10*time.Minute))
	// The hourly client's 5 hits, at two sites, in two records (a full counter).
	for _, site := range []string{"eu", "us"} {
		n := int64(3)
		if site == "us" {
			n = 2
		}
		if err := m.Add(t0, topics.Hit{Key: "hourly", Site: site, BucketStart: t0.UnixMilli(), Window: int64(hour), Count: n}); err != nil {
			t.Fatal(err)
		}
	}
	cs, _ := emitted(t, m.Emit(t0.Add(100*time.Millisecond)))
	if c := cs["hourly"]; c.Total != 5 {
		t.Fatalf("hourly published as %+v, want 5", c)
	}
	// Twenty minutes on, a flood of new keys: each takes an old counter's place.
	flood := t0.Add(20 * time.Minute)
	const newKeys = 40
	for k := range newKeys {
		if err := m.Add(flood, topics.Hit{Key: fmt.Sprintf("new-%d", k), Site: "eu", BucketStart: flood.UnixMilli(), Window: int64(hour), Count: 1}); err != nil {
			t.Fatal(err)
		}
	}
	if got := metricValue(t, reg, "streamlimit_aggregator_evicted_keys_total"); got != newKeys {
		t.Errorf("evicted_keys_total %v, want %d", got, newKeys)
	}
	if e := m.st.get("hourly", int64(hour)); e == nil {
		t.Fatal("the hourly counter was evicted although 59 counters were hit longer ago")
	}
	out := m.Emit(flood.Add(100 * time.Millisecond))
	for _, e := range out {
		if string(e.Key) == "hourly" {
			t.Errorf("the flood published the hourly counter again (%d bytes)", len(e.Value))
		}
	}
	// Its next hit is counted on top of the five.
	next := flood.Add(time.Minute)
	if err := m.Add(next, topics.Hit{Key: "hourly", Site: "eu", BucketStart: next.UnixMilli(), Window: int64(hour), Count: 1}); err != nil {
		t.Fatal(err)
	}
	cs, _ = emitted(t, m.Emit(next.Add(100*time.Millisecond)))
	if c := cs["hourly"]; c.Total != 6 {
		t.Errorf("hourly published as %+v after its sixth hit, want 6", c)
	}
}

// tableOfOldKeys returns an aggregator that holds at most maxKeys counters, with its
// registry, after n keys ("old-0", ...) were hit once each at at, in an hour's window.
func tableOfOldKeys(t *testing.T, maxKeys, n int, at time.Time) (*Memory, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := NewMemory(Config{MaxKeys: maxKeys, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		h := topics.Hit{Key: fmt.Sprintf("old-%d", i), Site: "eu", BucketStart: at.UnixMilli(), Window: int64(hour), Count: 1}
		if err := m.Add(at, h); err != nil {
			t.Fatal(err)
		}
	}
	return m, reg
}
