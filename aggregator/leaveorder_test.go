package aggregator

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamlimit/streamlimit/topics"
)

// TestLeaveFollowsTheLastCounts: a site's last hits and its leave record, read together,
// reach the counts topic in that order: on the partition of the hits' key, the count that
// holds them comes before any heartbeat that reports the site as left. Otherwise enforcers
// learn that the site left, and share out its part of the room, while its last hits are
// missing from the counts. Counts are emitted every 2 s and heartbeats every 100 ms here,
// so a heartbeat round that did not publish the due counts first would come first.
func TestLeaveFollowsTheLastCounts(t *testing.T) {
	t.Parallel()
	onKfake(t, testLeaveFollowsTheLastCounts)
}

func testLeaveFollowsTheLastCounts(t *testing.T, e *env) {
	cfg := e.config(prometheus.NewRegistry())
	cfg.EmitInterval, cfg.HeartbeatInterval = 2*time.Second, 100*time.Millisecond
	a, _ := e.run(cfg)
	eventually(t, "ready", 60*time.Second, a.Ready)

	// A key on the partition of the leave record, so that Kafka keeps the two in order.
	leavePart := topics.Partition([]byte(topics.SiteLeaveKey), testPartitions)
	key := ""
	for i := 0; key == ""; i++ {
		if k := fmt.Sprintf("api|user=leaving-%d#%s", i, testWindow); topics.Partition([]byte(k), testPartitions) == leavePart {
			key = k
		}
	}
	now := time.Now()
	hit, err := topics.Hit{Key: key, Site: "gone", BucketStart: now.UnixMilli(), Window: testWindow.Milliseconds(), Count: 4}.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	// The instance heartbeats before it leaves: a leave counts only from an instance heard.
	beat, err := topics.Hit{Key: topics.SiteHeartbeatKey, Site: "gone", BucketStart: now.UnixMilli() - 1, Instance: "gone-1"}.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	leave, err := topics.Hit{Key: topics.SiteLeaveKey, Site: "gone", BucketStart: now.UnixMilli(), Instance: "gone-1"}.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	e.produceRecords(&kgo.Record{Topic: e.hits, Key: []byte(topics.SiteLeaveKey), Value: beat, Timestamp: now},
		&kgo.Record{Topic: e.hits, Key: []byte(key), Value: hit, Timestamp: now},
		&kgo.Record{Topic: e.hits, Key: []byte(topics.SiteLeaveKey), Value: leave, Timestamp: now})

	countPart := topics.Partition([]byte(key), testPartitions)
	var countAt, leftAt int64 = -1, -1
	eventually(t, "the count of the site's last hits and a heartbeat reporting it left", 30*time.Second, func() bool {
		countAt, leftAt = -1, -1
		for _, r := range e.countsRecs.all() {
			if r.Partition != countPart {
				continue
			}
			switch {
			case string(r.Key) == key && countAt < 0:
				countAt = r.Offset
			case topics.IsHeartbeatKey(r.Key) && leftAt < 0:
				if hb, err := topics.DecodeHeartbeat(r.Value); err == nil {
					if _, ok := hb.Left["gone"]; ok {
						leftAt = r.Offset
					}
				}
			}
		}
		return countAt >= 0 && leftAt >= 0
	})
	if leftAt < countAt {
		t.Fatalf("on counts partition %d a heartbeat reporting site gone left (offset %d) came before the count of its last hits (offset %d)",
			countPart, leftAt, countAt)
	}
}
