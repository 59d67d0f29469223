package aggregator

import (
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamlimit/streamlimit/topics"
)

// TestHitWrittenWhilePositioningIsCounted: a hit written to a newly assigned, empty
// partition while it is being positioned (after the end offsets are listed, before the
// listing by time) is counted, though its record's timestamp is older than the replay's
// start (a producer's retried or delayed batch). For such a partition the listing by time
// answers the end offset as of its own answer, past the new record; started there, the
// aggregator would never read it — a hit an enforcer published as its aggregator joined
// was lost so.
func TestHitWrittenWhilePositioningIsCounted(t *testing.T) {
	e := newEnv(t)
	reg := prometheus.NewRegistry()
	cfg := e.config(reg)
	// A record time 40 s back (before the replay's start, MaxWindow + Lateness = 32 s back)
	// for a bucket 22 s back in a 30 s window: within the skew allowed here.
	cfg.MaxClockSkew = 20 * time.Second
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	key := "api|user=joined#30s"
	var once sync.Once
	a.betweenListings = func() {
		once.Do(func() {
			now := time.Now()
			v, err := topics.Hit{Key: key, Site: "eu", BucketStart: now.Add(-22 * time.Second).UnixMilli(),
				Window: (30 * time.Second).Milliseconds(), Count: 3}.MarshalBinary()
			if err != nil {
				t.Error(err)
				return
			}
			e.produceRecords(&kgo.Record{Topic: e.hits, Key: []byte(key), Value: v, Timestamp: now.Add(-40 * time.Second)})
		})
	}
	e.start(a)
	eventually(t, "the count of the hit written while positioning", 30*time.Second, func() bool {
		got, _ := e.countsRecs.latest(t)
		c, ok := got[key]
		return ok && c.Total == 3
	})
	if n := metricValue(t, reg, "streamlimit_aggregator_records_in_total"); n != 1 {
		t.Fatalf("records_in_total = %v, want 1", n)
	}
}
