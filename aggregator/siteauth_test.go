package aggregator

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamlimit/streamlimit/internal/testenv"
	"github.com/streamlimit/streamlimit/topics"
)

// siteRecordsOfUS returns a Memory aggregator, the time its tests start at, and record,
// which adds a site record of site us (key: topics.SiteHeartbeatKey or SiteLeaveKey) of
// instance inst dated ts, read at t0 + at.
func siteRecordsOfUS(t *testing.T) (m *Memory, t0 time.Time, record func(at time.Duration, key, inst string, ts time.Time) error) {
	t.Helper()
	m, err := NewMemory(Config{HeartbeatInterval: time.Millisecond, MaxClockSkew: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	return m, t0, func(at time.Duration, key, inst string, ts time.Time) error {
		return m.AddFrom(t0.Add(at), "hits", topics.Hit{Key: key, Site: "us", BucketStart: ts.UnixMilli(), Instance: inst})
	}
}

// Leave records in a live site's name, written by whoever may write the hits topic, do
// not take the site for gone: a leave from an instance the site never heartbeated with,
// and one from the site's own instance dated 25 s ahead (beyond MaxSiteRecordAhead), are
// both refused and counted, every 100 ms for 10 s, while the site heartbeats every 500 ms.
// Before, the aggregator listed the site as left in most of its heartbeats.
func TestMemoryRefusesForgedLeaves(t *testing.T) {
	m, t0, record := siteRecordsOfUS(t)
	add := func(at time.Duration, key, inst string, ts time.Time) {
		// A refused record is an error of AddFrom: the forger's, counted below.
		_ = record(at, key, inst, ts)
	}
	left := 0
	for at := time.Duration(0); at < 10*time.Second; at += 100 * time.Millisecond {
		now := t0.Add(at)
		if at%(500*time.Millisecond) == 0 {
			add(at, topics.SiteHeartbeatKey, "us-1", now)
		}
		add(at, topics.SiteLeaveKey, "forger", now.Add(25*time.Second))
		add(at, topics.SiteLeaveKey, "forger", now)
		add(at, topics.SiteLeaveKey, "us-1", now.Add(25*time.Second))
		hb := heartbeats(t, m.Emit(now.Add(50*time.Millisecond)))["hits"]
		if _, ok := hb.Left["us"]; ok {
			left++
		} else if _, ok := hb.Sites["us"]; !ok && at > 0 {
			t.Fatalf("at %v us is neither live nor left: %+v", at, hb)
		}
	}
	if left != 0 {
		t.Fatalf("us listed as left in %d of 100 heartbeats, want 0", left)
	}
	if got := testutil.ToFloat64(m.m.bad.WithLabelValues(ReasonStrangerLeave)); got != 100 {
		t.Errorf("bad_records_total{reason=%q} = %v, want 100", ReasonStrangerLeave, got)
	}
	if got := testutil.ToFloat64(m.m.bad.WithLabelValues(ReasonTooFarFuture)); got != 200 {
		t.Errorf("bad_records_total{reason=%q} = %v, want 200", ReasonTooFarFuture, got)
	}
	// The site's own leave, dated now, still counts.
	add(10*time.Second, topics.SiteLeaveKey, "us-1", t0.Add(10*time.Second))
	if hb := heartbeats(t, m.Emit(t0.Add(10200*time.Millisecond)))["hits"]; hb.Left["us"] == 0 {
		t.Fatalf("us's own leave: heartbeat %+v, want us left", hb)
	}
}

// Leave records naming the site's own instance, as whoever can read the hits topic (and
// so the instance names in it) may write without site keys, dated now and 1 s ahead (as
// far ahead as a site record is taken) every 100 ms for 10 s, while the instance
// heartbeats every 500 ms: each leave is taken and undone by the instance's next heartbeat
// (dated later than any before the leave, so no replay). The first is reported until then
// (300 ms, from its emission interval on); the later ones, held for leaveSilence once a
// leave was forged, never are. Before, the first leave put the instance in gone, every
// later heartbeat of it was skipped as a replay, and us was listed as left in 99 of the
// 100 heartbeats. The instance's real leave, at the end, still counts, after leaveSilence.
func TestMemoryUndoesLeavesNamingALiveInstance(t *testing.T) {
	m, t0, record := siteRecordsOfUS(t)
	add := func(at time.Duration, key, inst string, ts time.Time) {
		t.Helper()
		if err := record(at, key, inst, ts); err != nil {
			t.Fatal(err)
		}
	}
	left := 0
	for at := time.Duration(0); at < 10*time.Second; at += 100 * time.Millisecond {
		now := t0.Add(at)
		if at%(500*time.Millisecond) == 0 {
			add(at, topics.SiteHeartbeatKey, "us-1", now)
		}
		add(at, topics.SiteLeaveKey, "us-1", now)
		add(at, topics.SiteLeaveKey, "us-1", now.Add(topics.MaxSiteRecordAhead))
		hb := heartbeats(t, m.Emit(now.Add(50*time.Millisecond)))["hits"]
		if _, ok := hb.Left["us"]; ok {
			left++
			if at >= 500*time.Millisecond {
				t.Errorf("at %v us listed as left, after its heartbeat undid the first leave", at)
			}
		} else if _, ok := hb.Sites["us"]; !ok {
			t.Fatalf("at %v us is neither live nor left: %+v", at, hb)
		}
	}
	if left > 4 {
		t.Fatalf("us listed as left in %d of 100 heartbeats, want at most 4 (the first leave's)", left)
	}
	// Each heartbeat after the first undoes the leave taken since the one before it.
	if got := testutil.ToFloat64(m.m.bad.WithLabelValues(ReasonUndoneLeave)); got != 19 {
		t.Errorf("bad_records_total{reason=%q} = %v, want 19", ReasonUndoneLeave, got)
	}
	// The instance's own leave, its last record, counts once it has been silent for
	// leaveSilence after it.
	add(10*time.Second, topics.SiteHeartbeatKey, "us-1", t0.Add(10*time.Second))
	add(10*time.Second, topics.SiteLeaveKey, "us-1", t0.Add(10*time.Second))
	if hb := heartbeats(t, m.Emit(t0.Add(10*time.Second+leaveSilence*time.Millisecond-time.Millisecond)))["hits"]; hb.Left["us"] != 0 {
		t.Fatalf("us's own leave before leaveSilence: heartbeat %+v, want us live", hb)
	}
	if hb := heartbeats(t, m.Emit(t0.Add(10*time.Second+leaveSilence*time.Millisecond)))["hits"]; hb.Left["us"] == 0 {
		t.Fatalf("us's own leave: heartbeat %+v, want us left", hb)
	}
}

const (
	testKeyEU = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
	testKeyUS = "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100"
)

// With site keys, a hits-topic record counts only when its header proves the site it
// names: a hit in us's name without a signature, one signed with eu's key, one of a site
// without a key and a forged leave are skipped and counted by reason, while signed hits,
// a signed batch whose hits are re-routed (and signed again by the aggregator) and a
// signed heartbeat count.
func TestSiteAuthentication(t *testing.T) {
	t.Parallel()
	onKfake(t, testSiteAuthentication)
}

func testSiteAuthentication(t *testing.T, e *env) {
	keys, err := topics.ParseSiteKeys([]byte("eu " + testKeyEU + "\nus " + testKeyUS + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	eu, _ := keys.Key("eu")
	us, _ := keys.Key("us")
	reg := prometheus.NewRegistry()
	cfg := e.config(reg)
	cfg.SiteKeys = keys
	var logs testenv.SyncBuffer
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	a, _ := e.run(cfg)
	eventually(t, "ready", 60*time.Second, a.Ready)

	now := time.Now()
	w := testWindow.Milliseconds()
	rec := func(key string, part int32, value, mac []byte) *kgo.Record {
		r := &kgo.Record{Topic: e.hits, Partition: part, Key: []byte(key), Value: value, Timestamp: now}
		if mac != nil {
			r.Headers = []kgo.RecordHeader{{Key: topics.HeaderSiteMAC, Value: mac}}
		}
		return r
	}
	hit := func(key, site string, n int64) []byte {
		v, err := topics.Hit{Key: key, Site: site, BucketStart: now.UnixMilli(), Window: w, Count: n}.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	const key = "auth|user=5"
	part := topics.Partition([]byte(key), testPartitions)
	// A key owned by another partition than key's, for a batch written to key's.
	other := ""
	for i := 0; other == ""; i++ {
		if k := fmt.Sprintf("auth|user=moved-%d", i); topics.Partition([]byte(k), testPartitions) != part {
			other = k
		}
	}
	batch, err := topics.AppendHitBatch(nil, "us")
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range []topics.Hit{{Key: key, BucketStart: now.UnixMilli(), Window: w, Count: 2}, {Key: other, BucketStart: now.UnixMilli(), Window: w, Count: 4}} {
		if batch, err = h.AppendToBatch(batch); err != nil {
			t.Fatal(err)
		}
	}
	beat, err := topics.Hit{Key: topics.SiteHeartbeatKey, Site: "us", BucketStart: now.UnixMilli(), Instance: "us-1"}.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	leave, err := topics.Hit{Key: topics.SiteLeaveKey, Site: "us", BucketStart: now.UnixMilli(), Instance: "us-1"}.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	v := hit(key, "us", 5)
	ghost := hit(key, "ghost", 11)
	recs := []*kgo.Record{
		rec(key, part, hit(key, "eu", 3), topics.SiteMAC(eu, hit(key, "eu", 3))),
		rec(key, part, v, nil),                           // unsigned
		rec(key, part, v, topics.SiteMAC(eu, v)),         // signed by another site
		rec(key, part, ghost, topics.SiteMAC(eu, ghost)), // a site without a key
		rec(topics.HitBatchKey, part, batch, topics.SiteMAC(us, batch)),
	}
	for q := range int32(testPartitions) {
		recs = append(recs, rec(topics.SiteHeartbeatKey, q, beat, topics.SiteMAC(us, beat)))
		recs = append(recs, rec(topics.SiteLeaveKey, q, leave, topics.SiteMAC(eu, leave))) // forged
	}
	if err := newManualProducer(t, e).ProduceSync(t.Context(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the signed hits counted", 60*time.Second, func() bool {
		got, _ := e.countsRecs.latest(t)
		return got[key].Total == 5 && got[other].Total == 4
	})
	got, _ := e.countsRecs.latest(t)
	sites := map[string]float64{}
	for _, sc := range got[key].Sites {
		sites[sc.Site] = sc.Count
	}
	if c := got[key]; sites["eu"] != 3 || sites["us"] != 2 || len(sites) != 2 {
		t.Fatalf("count of %s: %+v, want eu 3 and us 2 (the signed hits only)", key, c)
	}
	for reason, n := range map[string]float64{"unsigned": 1, "bad_signature": 1 + testPartitions, "unknown_site": 1} {
		if got := metricValue(t, reg, "streamlimit_aggregator_bad_records_total", "reason", reason); got != n {
			t.Errorf("bad_records_total{reason=%q} = %v, want %v", reason, got, n)
		}
	}
	// Logged, but not once per record: the forged leaves, refused together, at most
	// once a second.
	for reason, most := range map[string]int{"unsigned": 1, "bad_signature": 2, "unknown_site": 1} {
		n := strings.Count(logs.String(), "reason="+reason)
		if n < 1 || n > most {
			t.Errorf("reason %s logged %d times, want 1 to %d:\n%s", reason, n, most, logs.String())
		}
	}
	if n := metricValue(t, reg, "streamlimit_aggregator_rerouted_total"); n != 1 {
		t.Errorf("rerouted_total = %v, want 1", n)
	}
	// The signed heartbeat counts, the forged leave does not: us is live.
	eventually(t, "us live in the heartbeats", 30*time.Second, func() bool {
		for _, r := range e.countsRecs.all() {
			if hb, err := topics.DecodeHeartbeat(r.Value); err == nil && topics.IsHeartbeatKey(r.Key) && hb.Sites["us"] != 0 {
				return true
			}
		}
		return false
	})
	for _, r := range e.countsRecs.all() {
		if hb, err := topics.DecodeHeartbeat(r.Value); err == nil && topics.IsHeartbeatKey(r.Key) && hb.Left["us"] != 0 {
			t.Fatalf("a forged leave listed us as left: %+v", hb)
		}
	}
}

// TestLeaveWhereTheSiteWasNeverHeard: a producer stopped before its heartbeats reached every
// partition writes its leave to partitions where its site was never heard. Such a leave
// changes nothing and is not a stranger's; one where other instances of the site were heard
// is, and one from the instance heard is taken.
func TestLeaveWhereTheSiteWasNeverHeard(t *testing.T) {
	s := testState(16)
	p0, p1 := tp{topic: "hits", part: 0}, tp{topic: "hits", part: 1}
	const now = 1_000_000
	s.heardFrom(p0, "us", "us-1", now)
	if taken, stranger := s.leftFrom(now, p1, "us", "us-1", now); taken || stranger {
		t.Errorf("leave on a partition where us was never heard: taken %v, stranger %v; want neither", taken, stranger)
	}
	if taken, stranger := s.leftFrom(now, p0, "us", "forger", now); taken || !stranger {
		t.Errorf("leave of an unheard instance where us-1 was heard: taken %v, stranger %v; want a stranger's", taken, stranger)
	}
	if taken, stranger := s.leftFrom(now, p0, "us", "us-1", now); !taken || stranger {
		t.Errorf("leave of us-1 where it was heard: taken %v, stranger %v; want taken", taken, stranger)
	}
}

// A heartbeat of an instance that left, written again later (a replay of its old, signed
// records by someone who can read the topic), must not bring its site back: the site
// would be live as of its leave, soon silent, and kept counted as cut off. Instance us-1
// heartbeats every 500 ms and leaves at 2 s; then its heartbeats of the first two seconds
// (the records it wrote, dated 0 to 1.5 s) are written again every 100 ms for 5 s. us stays listed as left, every replay is counted,
// and a new instance of us (a restart under the name) still brings it back.
func TestMemoryRefusesReplayedHeartbeats(t *testing.T) {
	m, t0, record := siteRecordsOfUS(t)
	add := func(at time.Duration, key, inst string, ts time.Time) {
		t.Helper()
		if err := record(at, key, inst, ts); err != nil {
			t.Fatal(err)
		}
	}
	for at := time.Duration(0); at < 2*time.Second; at += 500 * time.Millisecond {
		add(at, topics.SiteHeartbeatKey, "us-1", t0.Add(at))
	}
	add(2*time.Second, topics.SiteLeaveKey, "us-1", t0.Add(2*time.Second))
	replays, live := 0, 0
	for at := 2 * time.Second; at < 7*time.Second; at += 100 * time.Millisecond {
		add(at, topics.SiteHeartbeatKey, "us-1", t0.Add((at % (2 * time.Second)).Truncate(500*time.Millisecond)))
		replays++
		hb := heartbeats(t, m.Emit(t0.Add(at+50*time.Millisecond)))["hits"]
		if _, ok := hb.Sites["us"]; ok && at >= 2200*time.Millisecond {
			live++
		}
	}
	if live != 0 {
		t.Errorf("us listed live after its leave in %d heartbeats, want 0", live)
	}
	if got := testutil.ToFloat64(m.m.bad.WithLabelValues(ReasonReplayedHeartbeat)); got != float64(replays) {
		t.Errorf("bad_records_total{reason=%q} = %v, want %d", ReasonReplayedHeartbeat, got, replays)
	}
	add(7*time.Second, topics.SiteHeartbeatKey, "us-2", t0.Add(7*time.Second))
	if hb := heartbeats(t, m.Emit(t0.Add(7100*time.Millisecond)))["hits"]; hb.Sites["us"] == 0 {
		t.Fatalf("a new instance of us: heartbeat %+v, want us live", hb)
	}
}
