package aggregator

import (
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/streamlimit/streamlimit/clock"
	"github.com/streamlimit/streamlimit/topics"
)

// skewWorld is two data centers, eu and us, each with an aggregator (a Memory) and sites,
// every clock off true time by its own offset, joined by a link of a fixed delay: the
// aggregators exchange lag reports as the hits topics would carry them.
type skewWorld struct {
	aggs  [2]*Memory
	aggOf [2]time.Duration
	sites [2]map[string]time.Duration // site → its clock's offset
	local time.Duration
	link  time.Duration
	q     []skewMsg
}

type skewMsg struct {
	at   time.Duration // true time it arrives
	to   int
	from int
	hit  *topics.Hit
	rep  []byte
}

var skewDCs = [2]string{"eu", "us"}

func (w *skewWorld) topicAt(to, from int) string {
	if to == from {
		return topics.DefaultHitsTopic
	}
	return topics.RemoteHitsTopic(skewDCs[from], topics.DefaultHitsTopic)
}

func (w *skewWorld) delay(from, to int) time.Duration {
	if from == to {
		return w.local
	}
	return w.local + w.link
}

// run advances true time from 0 to end in 10 ms steps: sites heartbeat every 500 ms of
// their clocks, aggregators emit and report every 100 ms of theirs.
func (w *skewWorld) run(t *testing.T, t0 time.Time, end time.Duration) {
	for now := time.Duration(0); now <= end; now += 10 * time.Millisecond {
		for d := range 2 {
			for site, off := range w.sites[d] {
				if (now+off)%(500*time.Millisecond) == 0 {
					h := topics.Hit{Key: topics.SiteHeartbeatKey, Site: site, BucketStart: t0.Add(now + off).UnixMilli(), Instance: site + "#1"}
					for to := range 2 {
						w.q = append(w.q, skewMsg{at: now + w.delay(d, to), to: to, from: d, hit: &h})
					}
				}
			}
		}
		keep := w.q[:0]
		for _, m := range w.q {
			if m.at > now {
				keep = append(keep, m)
				continue
			}
			at := t0.Add(now + w.aggOf[m.to])
			var err error
			if m.rep != nil {
				err = w.aggs[m.to].AddLagReport(at, w.topicAt(m.to, m.from), m.rep)
			} else {
				err = w.aggs[m.to].AddFrom(at, w.topicAt(m.to, m.from), *m.hit)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		w.q = keep
		for d := range 2 {
			at := t0.Add(now + w.aggOf[d])
			if (now+w.aggOf[d])%(100*time.Millisecond) != 0 {
				continue
			}
			w.aggs[d].Emit(at)
			if rep := w.aggs[d].LagReport(at); rep != nil {
				w.q = append(w.q, skewMsg{at: now + w.delay(d, 1-d), to: 1 - d, from: d, rep: rep})
			}
		}
	}
}

// Each aggregator estimates every site's clock against its own, the remote ones from the
// lag reports exchanged (the link's delay told from the clocks' offset), and re-dates their
// records by it: a site's estimate is its offset behind the aggregator plus the local hop,
// whatever the link's delay; and one past clock.MaxAhead is held to it.
func TestSkewEstimatesEverySiteAgainstTheAggregator(t *testing.T) {
	reg := prometheus.NewRegistry()
	w := &skewWorld{local: 10 * time.Millisecond, link: 150 * time.Millisecond,
		aggOf: [2]time.Duration{-300 * time.Millisecond, 200 * time.Millisecond},
		sites: [2]map[string]time.Duration{
			{"eu-1": 400 * time.Millisecond, "eu-2": -100 * time.Millisecond},
			{"us-1": -500 * time.Millisecond, "us-2": -3 * time.Second},
		}}
	for d := range 2 {
		cfg := Config{InstanceID: skewDCs[d], Logger: slog.New(slog.DiscardHandler)}
		if d == 0 {
			cfg.Registerer = reg
		}
		var err error
		if w.aggs[d], err = NewMemory(cfg); err != nil {
			t.Fatal(err)
		}
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	w.run(t, t0, 12*time.Second)
	limit := clock.MaxAhead
	for d := range 2 {
		for from := range 2 {
			for site, off := range w.sites[from] {
				want := min(w.aggOf[d]-off+w.local, limit)
				got, ok := w.aggs[d].ClockOffset(w.topicAt(d, from), site)
				if !ok || got < want-2*time.Millisecond || got > want+2*time.Millisecond {
					t.Errorf("%s's aggregator, site %s: offset %v (%v), want %v", skewDCs[d], site, got, ok, want)
				}
			}
		}
	}
	if got := metricValue(t, reg, "streamlimit_aggregator_clock_offset_max_seconds"); got != limit.Seconds() {
		t.Errorf("clock_offset_max_seconds = %v, want the bound %v", got, limit.Seconds())
	}
	// At eu (−300 ms): us-2 is held to the bound, us-1 is −300 − (−500) + 10 = 210 ms behind.
	if got := metricValue(t, reg, "streamlimit_aggregator_clock_offset_seconds", "topic", "us.hits"); got < 0.604 || got > 0.606 {
		t.Errorf("clock_offset_seconds{us.hits} = %v, want the mean of 1 s and 210 ms", got)
	}
}

// A record of a site counted before its site has an estimate would keep its site's date
// until it left the window; it waits for the estimate instead (for a second at most), and
// is counted re-dated.
func TestSkewParksRecordsUntilTheirSiteIsEstimated(t *testing.T) {
	m, err := NewMemory(Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	const key = "api|user=1#10s"
	// Sites send site records here (eu-0 has); eu-1's clock is 400 ms behind the
	// aggregator's, and its hit arrives before its first site record.
	if err := m.Add(t0, topics.Hit{Key: topics.SiteHeartbeatKey, Site: "eu-0", BucketStart: t0.UnixMilli()}); err != nil {
		t.Fatal(err)
	}
	hit := topics.Hit{Key: key, Site: "eu-1", BucketStart: t0.Add(-400 * time.Millisecond).UnixMilli(), Window: 10000, Count: 3}
	if err := m.Add(t0, hit); err != nil {
		t.Fatal(err)
	}
	if out := m.Emit(t0.Add(100 * time.Millisecond)); countOf(t, out, key) != nil {
		t.Fatalf("the hit was counted before its site was estimated")
	}
	hb := topics.Hit{Key: topics.SiteHeartbeatKey, Site: "eu-1", BucketStart: t0.Add(-300 * time.Millisecond).UnixMilli()}
	if err := m.Add(t0.Add(105*time.Millisecond), hb); err != nil {
		t.Fatal(err)
	}
	if d, ok := m.ClockOffset(topics.DefaultHitsTopic, "eu-1"); !ok || d != 405*time.Millisecond {
		t.Fatalf("offset %v (%v), want 405ms at once", d, ok)
	}
	// Counted, dated 5 ms after it was made by the aggregator's clock: it leaves the
	// window then, not 400 ms earlier.
	c := countOf(t, m.Emit(t0.Add(9_900*time.Millisecond)), key)
	if c == nil || c.Total != 3 {
		t.Fatalf("count before the window passes: %+v, want 3", c)
	}
	// Without a site record, a record waits a second and is counted as dated.
	late := topics.Hit{Key: key, Site: "eu-9", BucketStart: t0.Add(10 * time.Second).UnixMilli(), Window: 10000, Count: 1}
	if err := m.Add(t0.Add(10*time.Second), late); err != nil {
		t.Fatal(err)
	}
	if c := countOf(t, m.Emit(t0.Add(10_500*time.Millisecond)), key); c != nil && c.Site("eu-9") != 0 {
		t.Fatalf("eu-9 counted before it waited a second: %+v", c)
	}
	if c := countOf(t, m.Emit(t0.Add(11_100*time.Millisecond)), key); c == nil || c.Site("eu-9") != 1 {
		t.Fatalf("eu-9 not counted after a second: %+v", c)
	}
	// A site that sends no site records waits only in its first second here: its later
	// records are counted at once.
	late.BucketStart, late.Count = t0.Add(12*time.Second).UnixMilli(), 2
	if err := m.Add(t0.Add(12*time.Second), late); err != nil {
		t.Fatal(err)
	}
	if c := countOf(t, m.Emit(t0.Add(12_100*time.Millisecond)), key); c == nil || c.Site("eu-9") != 3 {
		t.Fatalf("eu-9's later hit waited: %+v", c)
	}
}

// countOf returns the count of key among out, or nil.
func countOf(t *testing.T, out []Emission, key string) *topics.Count {
	t.Helper()
	for _, e := range out {
		if string(e.Key) == key && e.Value != nil {
			c, err := topics.DecodeCount(e.Value)
			if err != nil {
				t.Fatal(err)
			}
			return &c
		}
	}
	return nil
}
