package snapshot

import (
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/streamlimit/streamlimit/clock"
	"github.com/streamlimit/streamlimit/topics"
)

var t0 = time.Date(2025, 11, 21, 12, 0, 0, 0, time.UTC)

// countValue encodes a count record value; sites maps site → count and Total is their sum.
func countValue(t testing.TB, key string, window time.Duration, asOf time.Time, sites map[string]float64) []byte {
	t.Helper()
	c := topics.Count{Key: key, Window: window.Milliseconds(), AsOf: asOf.UnixMilli()}
	names := make([]string, 0, len(sites))
	for s := range sites {
		names = append(names, s)
	}
	sort.Strings(names)
	for _, s := range names {
		c.Sites = append(c.Sites, topics.SiteCount{Site: s, Count: sites[s]})
		c.Total += sites[s]
	}
	b, err := c.MarshalBinary()
	if err != nil {
		t.Fatalf("encode count: %v", err)
	}
	return b
}

func heartbeat(t testing.TB, topic string, p int32, asOf time.Time, replaying bool) (key, value []byte) {
	t.Helper()
	h := topics.Heartbeat{Instance: "agg-1", Topic: topic, Partition: p, AsOf: asOf.UnixMilli(), Offset: 90, HighWatermark: 100, Replaying: replaying}
	v, err := h.MarshalBinary()
	if err != nil {
		t.Fatalf("encode heartbeat: %v", err)
	}
	return []byte(topics.HeartbeatKey(topic, p)), v
}

type fixture struct {
	s   *Snapshot
	clk *clock.Fake
	reg *prometheus.Registry
}

func newFixture(t testing.TB, cfg Config) fixture {
	t.Helper()
	f := fixture{clk: clock.NewFake(t0), reg: prometheus.NewRegistry()}
	cfg.Clock, cfg.Registerer = f.clk, f.reg
	if cfg.Site == "" {
		cfg.Site = "eu"
	}
	s, err := NewMemory(cfg)
	if err != nil {
		t.Fatalf("NewMemory: %v", err)
	}
	f.s = s
	return f
}

// metric returns the value of the metric family name with the given label pairs, or fails.
func (f fixture) metric(t testing.TB, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := f.reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				if !hasLabel(m, labels[i], labels[i+1]) {
					continue next
				}
			}
			switch {
			case m.Counter != nil:
				return m.Counter.GetValue()
			case m.Gauge != nil:
				return m.Gauge.GetValue()
			}
		}
	}
	t.Fatalf("metric %s%v not found", name, labels)
	return 0
}

func hasLabel(m *dto.Metric, k, v string) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == k && l.GetValue() == v {
			return true
		}
	}
	return false
}

func (f fixture) apply(t testing.TB, key string, value []byte) {
	t.Helper()
	if err := f.s.Apply([]byte(key), value); err != nil {
		t.Fatalf("Apply(%q): %v", key, err)
	}
}

func TestSetOverwriteTombstone(t *testing.T) {
	f := newFixture(t, Config{})
	const k = "api:POST /articles|user=42"
	if _, ok := f.s.Get(k); ok {
		t.Fatal("empty snapshot returned an entry")
	}
	f.apply(t, k, countValue(t, k, time.Minute, t0, map[string]float64{"eu": 3, "us": 5}))
	e, ok := f.s.Get(k)
	if !ok {
		t.Fatal("key not found after Apply")
	}
	if e.Total != 8 || e.Mine != 3 || e.Remote() != 5 || e.Window != time.Minute || e.AsOf != t0.UnixMilli() {
		t.Fatalf("entry = %+v, want total 8, mine 3, remote 5, window 1m, asof %d", e, t0.UnixMilli())
	}
	if e.Site("us") != 5 || e.Site("ap") != 0 || e.Share() != 3.0/8 {
		t.Fatalf("Site(us)=%v Site(ap)=%v Share=%v", e.Site("us"), e.Site("ap"), e.Share())
	}

	// The last record applied wins, even with an older AsOf, as in the compacted log.
	f.apply(t, k, countValue(t, k, time.Minute, t0.Add(-time.Second), map[string]float64{"us": 1.5}))
	e, _ = f.s.Get(k)
	if e.Total != 1.5 || e.Mine != 0 || e.Share() != 0 || e.Remote() != 1.5 {
		t.Fatalf("after overwrite: %+v", e)
	}
	if f.s.Len() != 1 {
		t.Fatalf("Len = %d, want 1", f.s.Len())
	}

	for _, tomb := range [][]byte{nil, {}} {
		f.apply(t, k, countValue(t, k, time.Minute, t0, map[string]float64{"eu": 1}))
		f.apply(t, k, tomb)
		if _, ok := f.s.Get(k); ok {
			t.Fatalf("key survived tombstone %#v", tomb)
		}
	}
	if f.s.Len() != 0 {
		t.Fatalf("Len = %d after tombstones", f.s.Len())
	}
	// A tombstone for a key never seen is harmless.
	f.apply(t, "never-seen", nil)
	if got := f.metric(t, "streamlimit_snapshot_tombstones_total"); got != 3 {
		t.Fatalf("tombstones_total = %v, want 3", got)
	}
	if got := f.metric(t, "streamlimit_snapshot_records_applied_total"); got != 4 {
		t.Fatalf("records_applied_total = %v, want 4", got)
	}
	if got := f.metric(t, "streamlimit_snapshot_keys"); got != 0 {
		t.Fatalf("keys = %v, want 0", got)
	}
}

func TestJSONCountAccepted(t *testing.T) {
	f := newFixture(t, Config{})
	f.apply(t, "k", []byte(fmt.Sprintf(`{"key":"k","w":60000,"asof":%d,"total":4,"sites":{"us":1,"eu":3}}`, t0.UnixMilli())))
	e, ok := f.s.Get("k")
	if !ok || e.Total != 4 || e.Mine != 3 || e.AsOf != t0.UnixMilli() {
		t.Fatalf("Get = %+v, %v", e, ok)
	}
}

func TestHeartbeatFreshness(t *testing.T) {
	f := newFixture(t, Config{MaxStaleness: 10 * time.Second})
	s, clk := f.s, f.clk

	// No heartbeat yet: the age is the time since start, so a snapshot that never hears
	// from the aggregator turns stale.
	if s.Age() != 0 || s.Stale() {
		t.Fatalf("at start: Age %v, Stale %v", s.Age(), s.Stale())
	}
	clk.Advance(11 * time.Second)
	if s.Age() != 11*time.Second || !s.Stale() {
		t.Fatalf("no heartbeat for 11s: Age %v, Stale %v", s.Age(), s.Stale())
	}
	if got := f.metric(t, "streamlimit_snapshot_stale"); got != 1 {
		t.Fatalf("stale gauge = %v", got)
	}

	now := clk.Now()
	k0, v0 := heartbeat(t, "hits", 0, now, false)
	k1, v1 := heartbeat(t, "us.hits", 0, now.Add(-2*time.Second), false)
	f.apply(t, string(k0), v0)
	f.apply(t, string(k1), v1)
	if s.Age() != 2*time.Second || s.Stale() {
		t.Fatalf("fresh heartbeats: Age %v (want the oldest source's 2s), Stale %v", s.Age(), s.Stale())
	}
	if got := f.metric(t, "streamlimit_snapshot_age_seconds"); got != 2 {
		t.Fatalf("age_seconds = %v, want 2", got)
	}
	if got := f.metric(t, "streamlimit_snapshot_source_lag_records", "topic", "us.hits", "partition", "0"); got != 10 {
		t.Fatalf("source lag = %v, want 10", got)
	}

	// Heartbeats stop: stale once the oldest passes MaxStaleness, not before.
	clk.Advance(8 * time.Second)
	if s.Stale() {
		t.Fatalf("stale at age %v", s.Age())
	}
	clk.Advance(time.Millisecond)
	if !s.Stale() {
		t.Fatalf("not stale at age %v", s.Age())
	}
	srcs := s.Sources(clk.Now())
	if len(srcs) != 2 || srcs[0].Topic != "hits" || srcs[0].Stale || !srcs[1].Stale || srcs[1].Lag != 10 {
		t.Fatalf("Sources = %+v", srcs)
	}

	// Only the lagging source recovers the whole snapshot.
	k1, v1 = heartbeat(t, "us.hits", 0, clk.Now(), false)
	f.apply(t, string(k1), v1)
	if s.Stale() || s.Age() != 8*time.Second+time.Millisecond {
		t.Fatalf("after fresh heartbeat: Age %v, Stale %v", s.Age(), s.Stale())
	}

	// A replaying source makes the snapshot stale however fresh its heartbeat.
	k0, v0 = heartbeat(t, "hits", 0, clk.Now(), true)
	f.apply(t, string(k0), v0)
	if !s.Stale() {
		t.Fatal("not stale while a source replays")
	}
	k0, v0 = heartbeat(t, "hits", 0, clk.Now(), false)
	f.apply(t, string(k0), v0)
	if s.Stale() || s.Age() != 0 {
		t.Fatalf("after replay ended: Age %v, Stale %v", s.Age(), s.Stale())
	}

	// A heartbeat tombstone retires its source.
	clk.Advance(time.Minute)
	f.apply(t, string(k1), nil)
	f.apply(t, string(k0), nil)
	if len(s.Sources(clk.Now())) != 0 || s.Age() != clk.Now().Sub(t0) {
		t.Fatalf("after retiring all sources: %d sources, Age %v", len(s.Sources(clk.Now())), s.Age())
	}
	// Heartbeats are not counter keys.
	if s.Len() != 0 {
		t.Fatalf("Len = %d", s.Len())
	}
}

func TestBadRecordsSkippedAndCounted(t *testing.T) {
	f := newFixture(t, Config{})
	good := countValue(t, "k", time.Minute, t0, map[string]float64{"eu": 1})
	f.apply(t, "k", good)
	hbKey, hbVal := heartbeat(t, "hits", 3, t0, false)
	cases := []struct {
		name       string
		key, value []byte
		reason     string
		is         error
	}{
		{"unknown version", []byte("k"), []byte{0x7f, 1, 2}, "unknown_version", topics.ErrUnknownVersion},
		{"truncated", []byte("k"), good[:len(good)-3], "truncated", topics.ErrTruncated},
		{"bad json", []byte("k"), []byte(`{"key":`), "bad_json", topics.ErrBadJSON},
		{"negative total", []byte("k"), []byte(`{"key":"k","w":1000,"asof":1,"total":-1}`), "bad_count", topics.ErrBadCount},
		{"key mismatch", []byte("other"), good, "key_mismatch", ErrKeyMismatch},
		{"heartbeat not json", hbKey, []byte{1, 2, 3}, "unknown_version", topics.ErrUnknownVersion},
		{"heartbeat key mismatch", []byte(topics.HeartbeatKey("hits", 4)), hbVal, "key_mismatch", ErrKeyMismatch},
	}
	for _, c := range cases {
		err := f.s.Apply(c.key, c.value)
		if !errors.Is(err, c.is) {
			t.Errorf("%s: err = %v, want %v", c.name, err, c.is)
		}
	}
	for reason, want := range map[string]float64{"unknown_version": 2, "truncated": 1, "bad_json": 1, "bad_count": 1, "key_mismatch": 2} {
		if got := f.metric(t, "streamlimit_snapshot_bad_records_total", "reason", reason); got != want {
			t.Errorf("bad_records_total{reason=%q} = %v, want %v", reason, got, want)
		}
	}
	// The good entry is untouched, and no source was created by the bad heartbeats.
	if e, ok := f.s.Get("k"); !ok || e.Total != 1 {
		t.Fatalf("good entry = %+v, %v", e, ok)
	}
	if n := len(f.s.Sources(t0)); n != 0 {
		t.Fatalf("%d sources from bad heartbeats", n)
	}
	// Unknown reserved keys are ignored, not stored and not bad.
	f.apply(t, topics.ReservedPrefix+"future/x", []byte("whatever"))
	if _, ok := f.s.Get(topics.ReservedPrefix + "future/x"); ok || f.metric(t, "streamlimit_snapshot_ignored_records_total") != 1 {
		t.Fatal("reserved key not ignored")
	}
}

func TestBoundAndIdleSweep(t *testing.T) {
	f := newFixture(t, Config{MaxKeys: 3, MaxCountAhead: time.Minute})
	s := f.s
	f.apply(t, "a", countValue(t, "a", time.Minute, t0, map[string]float64{"eu": 1}))
	f.apply(t, "b", countValue(t, "b", time.Minute, t0.Add(30*time.Second), map[string]float64{"eu": 1}))
	f.apply(t, "c", countValue(t, "c", time.Hour, t0, map[string]float64{"eu": 1}))
	if err := s.Apply([]byte("d"), countValue(t, "d", time.Minute, t0, map[string]float64{"eu": 1})); !errors.Is(err, ErrFull) {
		t.Fatalf("fourth key: err = %v, want ErrFull", err)
	}
	if _, ok := s.Get("d"); ok || s.Len() != 3 || f.metric(t, "streamlimit_snapshot_refused_keys_total") != 1 {
		t.Fatalf("refused key stored or not counted: Len %d", s.Len())
	}
	// Updating a held key is never refused.
	f.apply(t, "a", countValue(t, "a", time.Minute, t0, map[string]float64{"eu": 2}))

	// A tombstone makes room.
	f.apply(t, "c", nil)
	f.apply(t, "d", countValue(t, "d", time.Minute, t0, map[string]float64{"eu": 1}))

	// Sweep removes exactly the entries whose window has passed (AsOf + Window ≤ now).
	if n := s.Sweep(t0.Add(time.Minute - time.Millisecond)); n != 0 {
		t.Fatalf("swept %d before any window passed", n)
	}
	if e, _ := s.Get("a"); e.Expired(t0.Add(time.Minute-time.Millisecond)) || !e.Expired(t0.Add(time.Minute)) {
		t.Fatal("Expired boundary wrong")
	}
	if n := s.Sweep(t0.Add(time.Minute)); n != 2 {
		t.Fatalf("swept %d, want 2 (a and d)", n)
	}
	if _, ok := s.Get("b"); !ok || s.Len() != 1 {
		t.Fatalf("b missing or Len %d", s.Len())
	}
	if got := f.metric(t, "streamlimit_snapshot_evicted_total"); got != 2 {
		t.Fatalf("evicted_total = %v", got)
	}
	f.apply(t, "e", countValue(t, "e", time.Minute, t0, map[string]float64{"eu": 1}))
	f.apply(t, "f", countValue(t, "f", time.Minute, t0, map[string]float64{"eu": 1}))
	if s.Len() != 3 {
		t.Fatalf("Len = %d, want 3", s.Len())
	}
}

func TestConcurrentReadersAndWriters(t *testing.T) {
	f := newFixture(t, Config{MaxKeys: 100})
	s := f.s
	const keys = 50
	var stop atomic.Bool
	var wg sync.WaitGroup
	values := make([][][]byte, keys)
	for k := range keys {
		key := fmt.Sprint("k", k)
		for v := range 4 {
			// Every published record has Total = 2 × Mine: a torn read would break it.
			values[k] = append(values[k], countValue(t, key, time.Minute, t0.Add(time.Duration(v)*time.Second), map[string]float64{"eu": float64(v + 1), "us": float64(v + 1)}))
		}
		values[k] = append(values[k], nil)
	}
	for w := range 2 {
		wg.Go(func() {
			for i := 0; !stop.Load(); i++ {
				k := (i*7 + w) % keys
				_ = s.Apply(fmt.Appendf(nil, "k%d", k), values[k][i%len(values[k])])
				if i%500 == 0 {
					s.Sweep(t0.Add(time.Duration(i%3) * time.Minute))
				}
			}
		})
	}
	var bad atomic.Int64
	for range 4 {
		wg.Go(func() {
			for i := 0; i < 20000; i++ {
				e, ok := s.Get(fmt.Sprint("k", i%keys))
				if ok && (e.Total != 2*e.Mine || e.Mine != e.Site("eu") || e.Mine < 1) {
					bad.Add(1)
				}
				_ = s.Stale()
			}
		})
	}
	for i := 0; i < 200; i++ {
		kk, vv := heartbeat(t, "hits", int32(i%3), t0, i%2 == 0)
		_ = s.Apply(kk, vv)
	}
	time.Sleep(50 * time.Millisecond)
	stop.Store(true)
	wg.Wait()
	if bad.Load() != 0 {
		t.Fatalf("%d inconsistent reads", bad.Load())
	}
	n := 0
	for k := range keys {
		if _, ok := s.Get(fmt.Sprint("k", k)); ok {
			n++
		}
	}
	if n != s.Len() {
		t.Fatalf("Len %d but %d keys found", s.Len(), n)
	}
}

func TestGetDoesNotAllocate(t *testing.T) {
	f := newFixture(t, Config{})
	f.apply(t, "key", countValue(t, "key", time.Minute, t0, map[string]float64{"eu": 1, "us": 2}))
	var sink float64
	allocs := testing.AllocsPerRun(1000, func() {
		e, _ := f.s.Get("key")
		_, _ = f.s.Get("missing")
		sink += e.Remote() + e.Share()
		if f.s.StaleAt(t0) {
			sink++
		}
	})
	if allocs != 0 {
		t.Fatalf("Get allocates %v times per call", allocs)
	}
}

func TestSitesInterned(t *testing.T) {
	f := newFixture(t, Config{})
	f.apply(t, "a", countValue(t, "a", time.Minute, t0, map[string]float64{"us-east-1": 1}))
	f.apply(t, "b", countValue(t, "b", time.Minute, t0, map[string]float64{"us-east-1": 1}))
	a, _ := f.s.Get("a")
	b, _ := f.s.Get("b")
	if unsafe.StringData(a.Sites[0].Site) != unsafe.StringData(b.Sites[0].Site) {
		t.Fatal("site names of two entries are not shared")
	}
}

func TestConfig(t *testing.T) {
	if _, err := New(Config{}); err == nil {
		t.Fatal("New without Brokers succeeded")
	}
	for _, c := range []Config{{MaxKeys: -1}, {MaxStaleness: -time.Second}, {SweepInterval: -1}} {
		if _, err := NewMemory(c); err == nil {
			t.Fatalf("NewMemory(%+v) succeeded", c)
		}
	}
	s, err := NewMemory(Config{})
	if err != nil {
		t.Fatal(err)
	}
	if !s.Ready() || s.cfg.MaxKeys != DefaultMaxKeys || s.cfg.MaxStaleness != DefaultMaxStaleness || s.cfg.Topic != topics.DefaultCountsTopic {
		t.Fatalf("defaults: %+v ready %v", s.cfg, s.Ready())
	}
	if err := s.Run(t.Context()); err == nil {
		t.Fatal("Run on a memory snapshot succeeded")
	}
	// Two snapshots on one registry conflict: the error says so instead of panicking.
	reg := prometheus.NewRegistry()
	if _, err := NewMemory(Config{Registerer: reg}); err != nil {
		t.Fatal(err)
	}
	if _, err := NewMemory(Config{Registerer: reg}); err == nil {
		t.Fatal("second registration succeeded")
	}
}

// A site is left once no source lists it as heard and some lists it as left: while its
// leave has not reached every partition it is still live. Peer is the latest other site
// heard on its sources.
func TestSiteTimesLeft(t *testing.T) {
	f := newFixture(t, Config{})
	hb := func(p int32, sites, left map[string]int64) {
		t.Helper()
		v, err := topics.Heartbeat{Instance: "a", Topic: "us.hits", Partition: p, AsOf: 300, Sites: sites, Left: left}.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		f.apply(t, topics.HeartbeatKey("us.hits", p), v)
	}
	hb(0, map[string]int64{"us2": 250}, map[string]int64{"us": 200})
	hb(1, map[string]int64{"us": 150, "us2": 240}, nil)
	if got, _ := f.s.SiteTimes().Get("us"); got != (SiteTime{Site: "us", Heard: 150, Peer: 250, Topic: "us.hits"}) {
		t.Fatalf("us left on one partition only: %+v, want live, heard up to 150", got)
	}
	hb(1, map[string]int64{"us2": 260}, map[string]int64{"us": 210})
	if got, _ := f.s.SiteTimes().Get("us"); got != (SiteTime{Site: "us", Heard: 210, Left: true, Peer: 260, Topic: "us.hits"}) {
		t.Fatalf("us left on every partition: %+v, want left at 210", got)
	}
	if got, _ := f.s.SiteTimes().Get("us2"); got.Left || got.Heard != 250 {
		t.Fatalf("us2: %+v", got)
	}
}

// Each site's time is the earliest any source gives it: a site is only as fresh as its
// most lagging partition.
func TestSiteTimes(t *testing.T) {
	f := newFixture(t, Config{})
	if f.s.SiteTimes() != nil {
		t.Fatal("site times before any heartbeat")
	}
	for p, sites := range []map[string]int64{{"eu": 100, "us": 90}, {"eu": 95}, {"us": 200, "ap": 7}} {
		hb := topics.Heartbeat{Instance: "a", Topic: "hits", Partition: int32(p), AsOf: 300, Sites: sites}
		v, err := hb.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		f.apply(t, topics.HeartbeatKey("hits", int32(p)), v)
	}
	st := f.s.SiteTimes()
	// Peer is the latest other site heard on a source that lists the site.
	// Topic is the hits topic the site is heard on.
	want := []SiteTime{{Site: "ap", Heard: 7, Peer: 200, Topic: "hits"}, {Site: "eu", Heard: 95, Peer: 90, Topic: "hits"}, {Site: "us", Heard: 90, Peer: 100, Topic: "hits"}}
	if got := st.Sites(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("sites %v, want %v", got, want)
	}
	if ms, ok := st.Heard("eu"); !ok || ms != 95 {
		t.Fatalf("Heard(eu) = %d, %v", ms, ok)
	}
	if _, ok := st.Heard("xx"); ok {
		t.Fatal("Heard of an unknown site")
	}
	// A tombstone retires a source and its sites.
	f.apply(t, topics.HeartbeatKey("hits", 2), nil)
	if _, ok := f.s.SiteTimes().Heard("ap"); ok {
		t.Fatal("ap still listed after its only source was retired")
	}
}

// A source whose heartbeats stop while the others' go on (its aggregator handing it over,
// restarting, or dead) is taken with its view of the sites as of the newest heartbeat: the
// pause is its aggregator's, and no site looks silent, or crashed, because of it. A site
// cut off still does.
func TestSiteTimesWhileAnAggregatorPauses(t *testing.T) {
	f := newFixture(t, Config{})
	beat := func(p int32, asOf int64, sites map[string]int64) {
		t.Helper()
		v, err := topics.Heartbeat{Instance: "a", Topic: "hits", Partition: p, AsOf: asOf, Sites: sites}.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		f.apply(t, topics.HeartbeatKey("hits", p), v)
	}
	get := func(site string) SiteTime {
		e, _ := f.s.SiteTimes().Get(site)
		return e
	}
	// Partition 1 had heard eu 300 ms and us 200 ms before its last heartbeat.
	beat(1, 10_000, map[string]int64{"eu": 9_700, "us": 9_800})
	// Then partition 1's aggregator stops; the others go on every 500 ms for 20 s.
	for asOf := int64(10_000); asOf <= 30_000; asOf += 500 {
		beat(0, asOf, map[string]int64{"eu": asOf - 500, "us": asOf - 400})
		beat(2, asOf, map[string]int64{"eu": asOf - 500, "us": asOf - 400})
		// Partition 1's view, as of the newest heartbeat, is fresher than the others'.
		if eu := get("eu"); eu.Heard != asOf-500 || eu.Peer < asOf-400 {
			t.Fatalf("partition 1 %d ms behind: eu %+v, want heard at %d and its peer us at %d", asOf-10_000, eu, asOf-500, asOf-400)
		}
	}
	// Its new owner takes over.
	beat(1, 30_000, map[string]int64{"eu": 29_600, "us": 29_600})
	if eu := get("eu"); eu.Heard != 29_500 {
		t.Fatalf("after the handover eu heard at %d, want 29500", eu.Heard)
	}
	// eu cut off: every source goes on, each with eu's time frozen; us is still heard.
	for asOf := int64(30_500); asOf <= 33_000; asOf += 500 {
		for p := range int32(3) {
			beat(p, asOf, map[string]int64{"eu": 29_500, "us": asOf - 400})
		}
	}
	if eu := get("eu"); eu.Heard != 29_500 {
		t.Fatalf("cut off: eu heard at %d, want 29500", eu.Heard)
	}
}

// A count made on another sub-bucket grid is refused and counted; one that states none
// (version 1) or the same is applied.
func TestSubBucketMismatch(t *testing.T) {
	f := newFixture(t, Config{SubBuckets: 60})
	for _, c := range []struct {
		sub int
		ok  bool
	}{{0, true}, {60, true}, {30, false}} {
		v, err := (&topics.Count{Key: "k", Window: 60000, AsOf: t0.UnixMilli(), Total: 1, SubBuckets: c.sub,
			Sites: []topics.SiteCount{{Site: "eu", Count: 1}}}).MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		err = f.s.Apply([]byte("k"), v)
		if c.ok != (err == nil) || (!c.ok && !errors.Is(err, ErrSubBuckets)) {
			t.Fatalf("sub-buckets %d: %v", c.sub, err)
		}
	}
	if got := f.metric(t, "streamlimit_snapshot_bad_records_total", "reason", "sub_buckets"); got != 1 {
		t.Fatalf("bad_records_total{sub_buckets} = %v", got)
	}
}

// A heartbeat that reports this enforcer's own site in conflict sets the gauge and logs at
// error level.
func TestSiteConflictReported(t *testing.T) {
	var logs strings.Builder
	f := newFixture(t, Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	hb := topics.Heartbeat{Instance: "a", Topic: "hits", Partition: 0, AsOf: t0.UnixMilli(), Conflicts: []string{"eu"}}
	v, err := hb.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	f.apply(t, topics.HeartbeatKey("hits", 0), v)
	if got := f.metric(t, "streamlimit_snapshot_site_conflicts"); got != 1 {
		t.Fatalf("site_conflicts = %v", got)
	}
	if !strings.Contains(logs.String(), "level=ERROR") || !strings.Contains(logs.String(), "site=eu") {
		t.Fatalf("no error logged: %q", logs.String())
	}
}

// A count from further ahead than DefaultMaxCountAhead (1 s), or a heartbeat from
// beyond the clock-skew bound, is refused and counted; one within it is applied. A count
// 25 s ahead, within the heartbeats' 30 s, was believed before.
func TestFutureRecordsRefused(t *testing.T) {
	f := newFixture(t, Config{})
	tenYears := t0.AddDate(10, 0, 0)
	if err := f.s.Apply([]byte("k"), countValue(t, "k", time.Minute, tenYears, map[string]float64{"us": 100})); !errors.Is(err, ErrTooFarFuture) {
		t.Fatalf("count 10 years ahead: %v, want ErrTooFarFuture", err)
	}
	if _, ok := f.s.Get("k"); ok {
		t.Fatal("count 10 years ahead was applied")
	}
	if err := f.s.Apply([]byte("k"), countValue(t, "k", time.Minute, t0.Add(25*time.Second), map[string]float64{"us": 0})); !errors.Is(err, ErrTooFarFuture) {
		t.Fatalf("count 25 s ahead: %v, want ErrTooFarFuture", err)
	}
	f.apply(t, "k", countValue(t, "k", time.Minute, t0.Add(DefaultMaxCountAhead), map[string]float64{"us": 1}))
	if e, ok := f.s.Get("k"); !ok || e.Total != 1 {
		t.Fatalf("count at the bound: %+v %v", e, ok)
	}

	hk, hv := heartbeat(t, "hits", 0, tenYears, false)
	if err := f.s.Apply(hk, hv); !errors.Is(err, ErrTooFarFuture) {
		t.Fatalf("heartbeat 10 years ahead: %v", err)
	}
	h := topics.Heartbeat{Instance: "a", Topic: "hits", Partition: 1, AsOf: t0.UnixMilli(), Sites: map[string]int64{"us": tenYears.UnixMilli()}}
	hv, _ = h.MarshalBinary()
	if err := f.s.Apply([]byte(topics.HeartbeatKey("hits", 1)), hv); !errors.Is(err, ErrTooFarFuture) {
		t.Fatalf("heartbeat with a site 10 years ahead: %v", err)
	}
	// Only the second heartbeat is applied, with the site's time held to the bound.
	if got := len(f.s.Sources(t0)); got != 1 {
		t.Fatalf("%d sources after future heartbeats, want 1", got)
	}
	if heard, ok := f.s.SiteTimes().Heard("us"); !ok || heard != t0.Add(DefaultMaxClockSkew).UnixMilli() {
		t.Fatalf("site us heard until %v (%v), want the skew bound", time.UnixMilli(heard).UTC(), ok)
	}
	if got := f.metric(t, "streamlimit_snapshot_bad_records_total", "reason", ReasonTooFarFuture); got != 4 {
		t.Fatalf("bad_records_total{too_far_future} = %v, want 4", got)
	}
}

// A total that is not the sum of the sites is refused: the decision reads both.
func TestBadTotalRefused(t *testing.T) {
	f := newFixture(t, Config{})
	c := topics.Count{Key: "k", Window: 60000, AsOf: t0.UnixMilli(), Total: 1e12, Sites: []topics.SiteCount{{Site: "us", Count: 1}}}
	v, err := c.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	if err := f.s.Apply([]byte("k"), v); !errors.Is(err, ErrBadTotal) {
		t.Fatalf("Apply: %v, want ErrBadTotal", err)
	}
	if got := f.metric(t, "streamlimit_snapshot_bad_records_total", "reason", ReasonBadTotal); got != 1 {
		t.Fatalf("bad_records_total{bad_total} = %v", got)
	}
	// Rounding of a sum added in another order is not an error.
	c = topics.Count{Key: "k", Window: 60000, AsOf: t0.UnixMilli(), Total: 0.1 + 0.2 + 0.3,
		Sites: []topics.SiteCount{{Site: "a", Count: 0.3}, {Site: "b", Count: 0.2}, {Site: "c", Count: 0.1}}}
	v, _ = c.MarshalBinary()
	f.apply(t, "k", v)
}

// A JSON count whose key escapes a lone surrogate is skipped and counted as bad_utf8, not
// applied under a key with U+FFFD in its place.
func TestJSONCountBadUTF8Counted(t *testing.T) {
	f := newFixture(t, Config{})
	v := fmt.Sprintf(`{"key":"k\udc01","w":60000,"asof":%d,"total":1,"sites":{"us":1}}`, t0.UnixMilli())
	if err := f.s.Apply([]byte("k\uFFFD"), []byte(v)); !errors.Is(err, topics.ErrBadUTF8) {
		t.Fatalf("Apply: %v, want ErrBadUTF8", err)
	}
	if got := f.metric(t, "streamlimit_snapshot_bad_records_total", "reason", "bad_utf8"); got != 1 {
		t.Fatalf("bad_records_total{bad_utf8} = %v", got)
	}
}

// TestRefFollowsItsKey: a Ref reads its key's latest count as Get does, update after
// update, until the count is tombstoned or swept; a count applied after that is seen by a
// new Ref, not the old one. Counts applied and tombstoned from several goroutines leave
// Len, Bytes and the map agreeing.
func TestRefFollowsItsKey(t *testing.T) {
	f := newFixture(t, Config{})
	s := f.s
	const k = "api|user=1#60s"
	apply := func(total float64) {
		t.Helper()
		if err := s.Apply([]byte(k), countValue(t, k, time.Minute, t0, map[string]float64{"eu": total})); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok := s.Ref(k).Get(); ok {
		t.Fatal("a Ref of a key never counted holds a count")
	}
	apply(1)
	r := s.Ref(k)
	for _, n := range []float64{2, 3} {
		apply(n)
		if e, ok := r.Get(); !ok || e.Total != n {
			t.Fatalf("after a count of %v the Ref reads %+v, %v", n, e, ok)
		}
	}
	if err := s.Apply([]byte(k), nil); err != nil {
		t.Fatal(err)
	}
	if _, ok := r.Get(); ok {
		t.Fatal("the Ref reads a tombstoned count")
	}
	apply(4)
	if _, ok := r.Get(); ok {
		t.Fatal("the old Ref reads the key's new count")
	}
	r = s.Ref(k)
	if e, ok := r.Get(); !ok || e.Total != 4 {
		t.Fatalf("a new Ref reads %+v, %v", e, ok)
	}
	if n := s.Sweep(t0.Add(2 * time.Minute)); n != 1 {
		t.Fatalf("swept %d", n)
	}
	if _, ok := r.Get(); ok || s.Len() != 0 || s.Bytes() != 0 {
		t.Fatalf("after the sweep: Ref %v, Len %d, Bytes %d", ok, s.Len(), s.Bytes())
	}

	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 2000 {
				if (i+g)%3 == 0 {
					_ = s.Apply([]byte(k), nil)
				} else {
					_ = s.Apply([]byte(k), countValue(t, k, time.Minute, t0, map[string]float64{"eu": float64(i)}))
				}
				s.Ref(k).Get()
			}
		})
	}
	wg.Wait()
	e, ok := s.Get(k)
	want := int64(0)
	if ok {
		want = entryBytes(k, &e)
	}
	if n := s.Len(); n != map[bool]int{true: 1}[ok] || s.Bytes() != want {
		t.Fatalf("after concurrent counts and tombstones: held %v, Len %d, Bytes %d (want %d)", ok, n, s.Bytes(), want)
	}
}

// A site is shown serving (SiteTime.Served) from the first count that lists it, at once,
// with that count's as-of time; a site that only heartbeats never is. A later count shows
// with the next heartbeat, or at once once it is servedRefresh past the time shown.
func TestSiteTimesServed(t *testing.T) {
	f := newFixture(t, Config{})
	hb := func() {
		k, v := heartbeat(t, "hits", 0, f.clk.Now(), false)
		h, err := topics.DecodeHeartbeat(v)
		if err != nil {
			t.Fatal(err)
		}
		h.Sites = map[string]int64{"eu": f.clk.Now().UnixMilli(), "us": f.clk.Now().UnixMilli(), "made-up": f.clk.Now().UnixMilli()}
		if v, err = h.MarshalBinary(); err != nil {
			t.Fatal(err)
		}
		f.apply(t, string(k), v)
	}
	served := func(site string) int64 {
		st, ok := f.s.SiteTimes().Get(site)
		if !ok {
			t.Fatalf("%s not listed", site)
		}
		return st.Served
	}
	hb()
	if served("eu") != 0 || served("us") != 0 || served("made-up") != 0 {
		t.Fatalf("served before any count: %v", f.s.SiteTimes().Sites())
	}
	f.apply(t, "k1", countValue(t, "k1", time.Minute, t0, map[string]float64{"eu": 2, "us": 1}))
	if served("eu") != t0.UnixMilli() || served("us") != t0.UnixMilli() || served("made-up") != 0 {
		t.Fatalf("after a count listing eu and us: %v", f.s.SiteTimes().Sites())
	}
	later := t0.Add(time.Second)
	f.apply(t, "k2", countValue(t, "k2", time.Minute, later, map[string]float64{"us": 1}))
	if served("us") != t0.UnixMilli() {
		t.Fatalf("us shown at %d before the next heartbeat, want the time already shown", served("us"))
	}
	hb()
	if served("us") != later.UnixMilli() || served("eu") != t0.UnixMilli() {
		t.Fatalf("after the next heartbeat: %v", f.s.SiteTimes().Sites())
	}
	f.clk.Advance(2 * time.Minute)
	f.apply(t, "k1", countValue(t, "k1", time.Minute, f.clk.Now(), map[string]float64{"eu": 1}))
	if served("eu") != f.clk.Now().UnixMilli() {
		t.Fatalf("eu's count %v past the time shown: shown %d, want %d at once", 2*time.Minute, served("eu"), f.clk.Now().UnixMilli())
	}
	since := func(site string) int64 { st, _ := f.s.SiteTimes().Get(site); return st.ServedSince }
	if since("eu") != t0.UnixMilli() {
		t.Fatalf("eu served since %d, want its first count's %d", since("eu"), t0.UnixMilli())
	}
	// After ServedSpan without a count, a count starts a new run.
	f.clk.Advance(ServedSpan + time.Second)
	f.apply(t, "k1", countValue(t, "k1", time.Minute, f.clk.Now(), map[string]float64{"eu": 1}))
	if since("eu") != f.clk.Now().UnixMilli() {
		t.Fatalf("eu back after %v: served since %d, want %d", ServedSpan, since("eu"), f.clk.Now().UnixMilli())
	}
}
