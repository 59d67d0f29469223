package producer

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamlimit/streamlimit/topics"
)

// counter is what the tests compare: hits per (key, window).
type counter struct {
	key    string
	window int64
}

// consumed is what readTopic found.
type consumed struct {
	counts  map[counter]int64
	records int
	hits    []topics.Hit
	parts   []int32 // partition of each hit, parallel to hits
	// siteHeartbeats are the site heartbeats found, by partition; they are not in the
	// fields above.
	siteHeartbeats map[int32][]topics.Hit
	// leaves are the site leave records found, by partition; they are not in the fields
	// above either.
	leaves map[int32][]topics.Hit
	// seq is every hit record, site heartbeats included, by partition in offset order.
	seq map[int32][]topics.Hit
	// batches is the number of hit batch records, whose hits are in the fields above;
	// nparts the topic's partition count.
	batches int
	nparts  int32
	// raw is every record read, headers included.
	raw []*kgo.Record
}

// readTopic reads every record of topic from the start up to its end offsets as of the
// call, decoding each as a topics.Hit.
func readTopic(t testing.TB, brokers []string, topic string, opts ...kgo.Opt) consumed {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	admCl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	defer admCl.Close()
	ends, err := kadm.NewClient(admCl).ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatalf("list end offsets: %v", err)
	}
	want := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Err != nil {
			t.Fatalf("end offset %s/%d: %v", o.Topic, o.Partition, o.Err)
		}
		if o.Offset > 0 {
			want[o.Partition] = o.Offset
		}
	})
	out := consumed{counts: map[counter]int64{}, nparts: int32(len(ends[topic]))}
	if len(want) == 0 {
		return out
	}
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for len(want) > 0 {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("reading %s: timed out with partitions %v unread", topic, want)
		}
		fs.EachError(func(tp string, p int32, err error) { t.Fatalf("fetch %s/%d: %v", tp, p, err) })
		fs.EachRecord(func(r *kgo.Record) {
			if end, ok := want[r.Partition]; ok && r.Offset+1 >= end {
				delete(want, r.Partition)
			}
			out.raw = append(out.raw, r)
			hs, err := topics.DecodeHits(r.Value)
			if err != nil {
				t.Fatalf("record %s/%d@%d: %v", r.Topic, r.Partition, r.Offset, err)
			}
			batch := topics.IsHitBatch(r.Value)
			if batch {
				if string(r.Key) != topics.HitBatchKey {
					t.Fatalf("hit batch under key %q", r.Key)
				}
				out.batches++
			}
			for _, h := range hs {
				out.add(t, r, h, batch)
			}
		})
	}
	return out
}

// add records hit h of record r (of a hit batch when batch is set).
func (out *consumed) add(t testing.TB, r *kgo.Record, h topics.Hit, batch bool) {
	t.Helper()
	switch {
	case batch:
		// Every hit of a batch belongs to the batch's partition, as if it were a record of
		// its own keyed by its key.
		if q := javaPartition([]byte(h.Key), out.nparts); q != r.Partition {
			t.Fatalf("hit of key %q in a batch on partition %d, owned by partition %d", h.Key, r.Partition, q)
		}
	case string(r.Key) != h.Key:
		t.Fatalf("record key %q, hit key %q", r.Key, h.Key)
	}
	if out.seq == nil {
		out.seq = map[int32][]topics.Hit{}
	}
	out.seq[r.Partition] = append(out.seq[r.Partition], h)
	if h.IsSiteLeave() {
		if out.leaves == nil {
			out.leaves = map[int32][]topics.Hit{}
		}
		out.leaves[r.Partition] = append(out.leaves[r.Partition], h)
		return
	}
	if h.IsSiteHeartbeat() {
		if out.siteHeartbeats == nil {
			out.siteHeartbeats = map[int32][]topics.Hit{}
		}
		out.siteHeartbeats[r.Partition] = append(out.siteHeartbeats[r.Partition], h)
		return
	}
	out.records++
	out.hits = append(out.hits, h)
	out.parts = append(out.parts, r.Partition)
	out.counts[counter{h.Key, h.Window}] += h.Count
}

// javaPartition is Kafka's Java default partition for a keyed record, computed with
// javaMurmur2, an implementation independent of franz-go's.
func javaPartition(key []byte, partitions int32) int32 {
	return (javaMurmur2(key) & 0x7fffffff) % partitions
}

// javaMurmur2 is a transcription of org.apache.kafka.common.utils.Utils.murmur2, in int32
// arithmetic as Java does it.
func javaMurmur2(data []byte) int32 {
	length := int32(len(data))
	const seed uint32 = 0x9747b28c
	const m int32 = 0x5bd1e995
	const r = 24
	h := int32(seed ^ uint32(length))
	length4 := length / 4
	for i := int32(0); i < length4; i++ {
		i4 := i * 4
		k := int32(data[i4+0]) + int32(data[i4+1])<<8 + int32(data[i4+2])<<16 + int32(data[i4+3])<<24
		k *= m
		k ^= int32(uint32(k) >> r)
		k *= m
		h *= m
		h ^= k
	}
	switch length % 4 {
	case 3:
		h ^= int32(data[(length & ^3)+2]) << 16
		fallthrough
	case 2:
		h ^= int32(data[(length & ^3)+1]) << 8
		fallthrough
	case 1:
		h ^= int32(data[length & ^3])
		h *= m
	}
	h ^= int32(uint32(h) >> 13)
	h *= m
	h ^= int32(uint32(h) >> 15)
	return h
}
