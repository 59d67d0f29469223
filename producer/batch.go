package producer

import (
	"context"
	"runtime"
	"slices"
	"unsafe"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamlimit/streamlimit/topics"
)

// maxBatchBytes bounds the value of one hit batch record: a few hundred counts, far below
// the broker's message size limit, and small enough that building one holds a busy
// server's core for microseconds.
const maxBatchBytes = 16 << 10

// placed is a count of a flush with the partition that owns its key.
type placed struct {
	part int32
	i    int32 // its index in the flush's batch
}

// sendAll hands a flush's counts to the Kafka client, at most room of them; the rest wait
// for a later flush (keepUnsent). Once the hits topic's partition count is known, the
// counts whose keys one partition owns travel together in hit batch records
// (topics.HitBatchKey), placed on that partition: Kafka's costs, the client's and the
// broker's alike, are per record, and a count of a key hit a few times a second is a
// record of its own, so that one record per count cost the enforcer's core about 2 µs and
// the broker's about 1 µs per count (docs/performance.md). Until the count is known (the
// partitioner learns it from the first record it places), or with SingleHitRecords, or
// with a caller's client (whose partitioner the Producer does not control), every count
// is a hit record of its own. The caller holds flushMu.
func (p *Producer) sendAll(batch []record, room int64) {
	n := int32(0)
	if p.ownClient && !p.cfg.SingleHitRecords {
		n = p.parts.n.Load()
	}
	if n <= 0 {
		for i, r := range batch {
			if room > 0 {
				p.send(r)
				room--
			} else {
				p.keepUnsent(r)
			}
			if i%256 == 255 {
				runtime.Gosched()
			}
		}
		return
	}
	// Order the counts by partition (a counting sort: two passes, no comparisons), each
	// partition's in the order of the flush.
	if cap(p.partCount) < int(n)+1 {
		p.partCount = make([]int32, n+1)
	}
	cnt := p.partCount[:n+1]
	clear(cnt)
	parts := p.partOf[:0]
	for i := range batch {
		if int64(len(parts)) >= room {
			p.keepUnsent(batch[i])
			continue
		}
		key := batch[i].ck.key
		// Partition only reads the key: no copy of it.
		q := topics.Partition(unsafe.Slice(unsafe.StringData(key), len(key)), n)
		parts = append(parts, q)
		cnt[q+1]++
	}
	for q := 1; q <= int(n); q++ {
		cnt[q] += cnt[q-1]
	}
	pl := slices.Grow(p.placed[:0], len(parts))[:len(parts)]
	for i, q := range parts { // the counts kept for later are past len(parts) in batch
		pl[cnt[q]] = placed{part: q, i: int32(i)}
		cnt[q]++
	}
	p.partOf = parts[:0]
	for j := 0; j < len(pl); {
		o := p.outRecord()
		q := pl[j].part
		buf, err := topics.AppendHitBatch(o.buf[:0], p.cfg.Site)
		if err != nil {
			// Unreachable: New validated the site.
			p.cfg.Logger.Error("producer: encoding a hit batch", "err", err)
			return
		}
		for ; j < len(pl) && pl[j].part == q && len(buf) < maxBatchBytes; j++ {
			r := batch[pl[j].i]
			h := topics.Hit{Key: r.ck.key, BucketStart: r.bucket, Window: r.ck.window, Count: r.n, Denied: r.d}
			if buf, err = h.AppendToBatch(buf); err != nil {
				// Unreachable: HitAt validated the key and window.
				p.cfg.Logger.Error("producer: encoding a hit", "key", r.ck.key, "err", err)
				continue
			}
			o.recs = append(o.recs, r)
		}
		if len(o.recs) == 0 {
			p.outFree.Put(o)
			continue
		}
		o.buf = buf
		o.kr = kgo.Record{Topic: p.cfg.Topic, Key: []byte(topics.HitBatchKey), Value: buf, Partition: q, Headers: p.proof(buf)}
		p.inflightRecs.Add(int64(len(o.recs)))
		for _, r := range o.recs {
			p.inflightHits.add(r.n)
		}
		p.cl.TryProduce(context.Background(), &o.kr, p.produced)
		runtime.Gosched() // let the requests in between two batches (see drain)
	}
	clear(pl)
	p.placed = pl[:0]
}

// outRecord returns an outRecord from the pool, or a new one.
func (p *Producer) outRecord() *outRecord {
	if o, _ := p.outFree.Get().(*outRecord); o != nil {
		return o
	}
	return &outRecord{}
}
