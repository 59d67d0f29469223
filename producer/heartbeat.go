package producer

import (
	"context"
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamlimit/streamlimit/topics"
)

// partitioner places records as every streamlimit client must (topics.Partition): a
// counter key by Kafka's default placement, the same as the Java client's, and site
// records and hit batches — keys under topics.ReservedPrefix — on the partition set in
// Record.Partition. Every record it places tells it the topic's partition count, which the
// heartbeats and the hit batches need.
type partitioner struct {
	n atomic.Int32 // partitions of the hits topic, 0 until a record was placed
}

func (p *partitioner) ForTopic(string) kgo.TopicPartitioner { return p }

// RequiresConsistency is true: every record goes where its key or Partition says, never
// to whichever partition is ready.
func (*partitioner) RequiresConsistency(*kgo.Record) bool { return true }

func (p *partitioner) Partition(r *kgo.Record, n int) int {
	p.n.Store(int32(n))
	if topics.IsReservedKey(r.Key) {
		return int(r.Partition) % n
	}
	return int(topics.Partition(r.Key, int32(n)))
}

// siteHeartbeat sends, when due, a site heartbeat stamped watermark (unix ms) to every
// partition of the hits topic: each partition's records before it hold every hit of this
// Producer's buckets that started before watermark, since kgo keeps a partition's records
// in order. That holds for hits stamped by Hit (the Producer's clock, read under the
// shard's lock) and by HitAt with a time not before the current bucket's start; a HitAt
// stamped further back may follow a heartbeat that has passed its bucket, and is counted
// all the same (the aggregator takes hits up to its Lateness late). It sends nothing while counts wait for
// Kafka to take them (the heartbeat would claim hits that are not there), before the
// partition count is known (then it sends one, to partition 0, to learn it), or when
// heartbeats are off. The caller holds flushMu.
func (p *Producer) siteHeartbeat(nowMs, watermark int64) {
	if p.cfg.SiteHeartbeatInterval < 0 || !p.ownClient || nowMs < p.hbNext {
		return
	}
	p.unsentMu.Lock()
	waiting := len(p.unsent)
	p.unsentMu.Unlock()
	if waiting > 0 {
		return
	}
	p.hbNext = nowMs + p.cfg.SiteHeartbeatInterval.Milliseconds()
	h := topics.Hit{Key: topics.SiteHeartbeatKey, Site: p.cfg.Site, BucketStart: watermark, Instance: p.cfg.Instance, Counter: p.cfg.Counter}
	v, err := h.MarshalBinary()
	if err != nil {
		// Unreachable: New validated the site.
		p.cfg.Logger.Error("producer: encoding a site heartbeat", "err", err)
		return
	}
	n := max(p.parts.n.Load(), 1)
	for i := range n {
		r := &kgo.Record{Topic: p.cfg.Topic, Key: []byte(topics.SiteHeartbeatKey), Value: v, Partition: i, Headers: p.proof(v)}
		p.cl.TryProduce(context.Background(), r, func(_ *kgo.Record, err error) {
			if err == nil {
				p.heartbeatsOut.Add(1)
			}
		})
	}
}

// leave writes a site leave record to every partition of the hits topic and waits until
// Kafka has them or ctx is done: the last records of this instance, after all of its hits.
// Without heartbeats (or with a client it does not own, whose partitions it may not know)
// it writes nothing, and its site is found silent instead.
func (p *Producer) leave(ctx context.Context) {
	if p.cfg.SiteHeartbeatInterval < 0 || !p.ownClient {
		return
	}
	now := p.cfg.Clock.Now().UnixMilli()
	h := topics.Hit{Key: topics.SiteLeaveKey, Site: p.cfg.Site, BucketStart: now, Instance: p.cfg.Instance, Counter: p.cfg.Counter}
	v, err := h.MarshalBinary()
	if err != nil {
		p.cfg.Logger.Error("producer: encoding a site leave record", "err", err)
		return
	}
	n := max(p.parts.n.Load(), 1)
	recs := make([]*kgo.Record, n)
	for i := range n {
		recs[i] = &kgo.Record{Topic: p.cfg.Topic, Key: []byte(topics.SiteLeaveKey), Value: v, Partition: i, Headers: p.proof(v)}
	}
	if err := p.cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		p.cfg.Logger.Warn("producer: the site leave records were not delivered; the other sites will find this one silent instead", "err", err)
		return
	}
	p.cfg.Logger.Info("producer: left", "site", p.cfg.Site, "instance", p.cfg.Instance, "partitions", n)
}

// proof returns the headers that prove the site of record value v: its
// topics.HeaderSiteMAC under Config.SiteKey, or none without a key.
func (p *Producer) proof(v []byte) []kgo.RecordHeader {
	if p.cfg.SiteKey == nil {
		return nil
	}
	return []kgo.RecordHeader{{Key: topics.HeaderSiteMAC, Value: topics.SiteMAC(p.cfg.SiteKey, v)}}
}
