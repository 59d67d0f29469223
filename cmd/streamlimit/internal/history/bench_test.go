package history

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamlimit/streamlimit/internal/testenv"
	"github.com/streamlimit/streamlimit/topics"
)

// BenchmarkReplay measures how fast export reads a range of the hits topic on the real
// broker: 100 000 hit records of 1 000 keys at 2 sites over 50 minutes, 4 partitions,
// replayed into per-minute rows.
func BenchmarkReplay(b *testing.B) {
	const keys, perKey = 1000, 100
	topic := testenv.CreateTopic(b, "hits", 4, nil)
	cl := testenv.KafkaClient(b, kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	from := time.Now().Truncate(time.Hour).Add(-2 * time.Hour)
	recs := make([]*kgo.Record, 0, keys*perKey)
	for i := range perKey {
		for k := range keys {
			h := topics.Hit{Key: fmt.Sprintf("api|user=%d#60s", k), Site: []string{"eu-1", "us-1"}[k%2],
				BucketStart: from.Add(time.Duration(i) * 30 * time.Second).UnixMilli(), Window: 60000, Count: 3}
			v, err := h.MarshalBinary()
			if err != nil {
				b.Fatal(err)
			}
			recs = append(recs, &kgo.Record{Key: []byte(h.Key), Value: v, Timestamp: h.BucketTime()})
		}
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		b.Fatal(err)
	}
	o := Options{Kafka: []kgo.Opt{kgo.SeedBrokers(testenv.Brokers(b)...)}, Topics: []string{topic},
		From: from, To: from.Add(time.Hour)}
	for b.Loop() {
		res, err := Replay(ctx, o)
		if err != nil {
			b.Fatal(err)
		}
		if res.Hits != keys*perKey || len(res.Rows) != keys*perKey/2 {
			b.Fatalf("%d hits in %d rows, want %d in %d", res.Hits, len(res.Rows), keys*perKey, keys*perKey/2)
		}
	}
	b.ReportMetric(float64(b.N*keys*perKey)/b.Elapsed().Seconds(), "records/s")
}
