package producer

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/streamlimit/streamlimit/internal/clock"
	"github.com/streamlimit/streamlimit/internal/testenv"
)

// BenchmarkHit measures Hit on 10 000 known keys with the real clock and the background
// flush running against an in-process kfake broker, serially and from parallel goroutines
// (run with -cpu 1,2).
func BenchmarkHit(b *testing.B) {
	c := newFake(b, 4, "hits")
	p, err := New(Config{Brokers: c.ListenAddrs(), Site: "eu-1", Logger: discard})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close(context.Background())
	keys := make([]string, 10_000)
	for i := range keys {
		keys[i] = fmt.Sprintf("api:POST /articles|user=%d", i)
		p.Hit(keys[i], time.Minute, 1)
	}
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			p.Hit(keys[i%len(keys)], time.Minute, 1)
			i++
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			i := int(time.Now().UnixNano()) % len(keys)
			for pb.Next() {
				p.Hit(keys[i%len(keys)], time.Minute, 1)
				i += 7
			}
		})
	})
}

// BenchmarkCoalescingRealBroker drives 1 000 keys at 1 000 hits/s each for 10 s of fake
// time through the real flush path (a background flush every 50 ms of fake time) into the
// real broker, and reports hits per record written.
func BenchmarkCoalescingRealBroker(b *testing.B) {
	brokers := testenv.Brokers(b)
	for b.Loop() {
		topic := testenv.CreateTopic(b, "hits", 4, nil)
		clk := clock.NewFake(time.UnixMilli(1_763_740_000_000))
		p, err := New(Config{Brokers: brokers, Topic: topic, Site: "eu-1", Clock: clk, FlushInterval: -1, Logger: discard})
		if err != nil {
			b.Fatal(err)
		}
		keys := make([]string, 1000)
		for i := range keys {
			keys[i] = fmt.Sprintf("key-%d", i)
		}
		const step = 10 * time.Millisecond // 10 hits per key per step = 1 000 hits/s
		for s := range 1000 {              // 10 s
			for _, k := range keys {
				p.Hit(k, time.Minute, 10)
			}
			clk.Advance(step)
			if s%5 == 4 {
				p.flush(false) // what the background flush does every 50 ms
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		if err := p.Close(ctx); err != nil {
			b.Fatal(err)
		}
		cancel()
		st := p.Stats()
		got := readTopic(b, brokers, topic)
		if got.records != int(st.RecordsOut) || st.HitsIn != 10_000_000 {
			b.Fatalf("topic has %d records, producer says %+v", got.records, st)
		}
		b.ReportMetric(float64(st.HitsIn)/float64(st.RecordsOut), "hits/record")
		b.ReportMetric(float64(st.RecordsOut), "records")
		b.ReportMetric(float64(st.BytesOut)/float64(st.RecordsOut), "bytes/record")
	}
}
