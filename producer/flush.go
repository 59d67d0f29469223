package producer

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"time"
	"unsafe"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamlimit/streamlimit/topics"
)

// reserve takes one slot of the memory bound, reporting false when it is full.
func (p *Producer) reserve() bool {
	for {
		c := p.buffered.Load()
		if c >= p.maxKeys {
			return false
		}
		if p.buffered.CompareAndSwap(c, c+1) {
			return true
		}
	}
}

// loop is the background flush. Its ticks fall just after multiples of FlushInterval on
// the Producer's clock, the instants at which buckets end when FlushInterval divides
// BucketWidth (as DefaultFlushInterval divides DefaultBucketWidth), so that a finished bucket leaves within a
// millisecond or two of its end instead of waiting up to a whole interval for the next
// tick.
func (p *Producer) loop() {
	defer close(p.done)
	d := p.cfg.FlushInterval
	wait := d - time.Duration(floorMod(p.cfg.Clock.Now().UnixNano(), int64(d))) + flushLag
	select {
	case <-p.stop:
		return
	case <-time.After(wait):
		p.drain(false, true)
	}
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
			p.drain(false, true)
		}
	}
}

// flush drains the shards and hands records to the Kafka client without waiting for
// acknowledgements. With all false, only finished buckets (those whose end is not after
// the clock's now) are drained, so that a bucket normally becomes exactly one record;
// with all true, the current buckets go too.
func (p *Producer) flush(all bool) { p.drain(all, false) }

// drain is flush; with spread, shard i's finished buckets are held back until
// i·FlushSpread/numShards after their end (Config.FlushSpread), so that the records of
// buckets that end together (every counter's, at each multiple of BucketWidth) reach the
// Kafka client in several smaller hand-offs instead of one.
func (p *Producer) drain(all, spread bool) {
	p.flushMu.Lock()
	defer p.flushMu.Unlock()
	start := p.cfg.Clock.Now()
	// The same reading of the clock as add's, so that a hit after this pass is not older.
	nowMs := p.clock.nowMs()
	p.flushes.Add(1)

	batch := p.batch[:0]
	room := p.maxInflight - p.inflightRecs.Load()
	// Older counts first: what Kafka could not take before, as much as fits.
	p.unsentMu.Lock()
	for rk, c := range p.unsent {
		if int64(len(batch)) >= room {
			break
		}
		batch = append(batch, record{ck: rk.ck, bucket: rk.bucket, n: c.n, d: c.d, bulk: c.bulk})
		delete(p.unsent, rk)
		p.unsentHits.add(-c.n)
		p.buffered.Add(-1)
		if c.bulk {
			p.bulk.Add(-1)
		}
	}
	p.unsentMu.Unlock()

	var released int64
	// watermark is the start of the oldest bucket still held back: every hit of an
	// earlier bucket is in this flush's batch or was handed to Kafka before. It starts at
	// the start of the bucket that holds nowMs, not at nowMs: a Hit that takes a shard's
	// lock after the loop below has passed it reads the clock then (add), so it lands in
	// this bucket or a later one, but this bucket starts before nowMs, and the hit would
	// follow a heartbeat stamped nowMs on the partition.
	watermark := nowMs - floorMod(nowMs, p.widthMs)
	for i := range p.shards {
		s := &p.shards[i]
		s.mu.Lock()
		batch = append(batch, s.pending...)
		clear(s.pending)
		s.pending = s.pending[:0]
		due := nowMs
		if spread {
			due -= p.spreadMs * int64(i) / numShards
		}
		if !all && len(s.dirty) > 0 && s.minEnd > due {
			// Nothing due: every dirty entry's bucket ends after due. A bucket is at most
			// BucketWidth long, so none of them starts before minEnd − BucketWidth: a
			// bound for the site heartbeats' watermark that needs no scan.
			watermark = min(watermark, s.minEnd-p.widthMs)
		} else {
			keep := s.dirty[:0]
			minEnd := int64(math.MaxInt64)
			for _, e := range s.dirty {
				if !all && e.end > due {
					keep = append(keep, e)
					watermark = min(watermark, e.bucket)
					minEnd = min(minEnd, e.end)
					continue
				}
				batch = append(batch, record{ck: e.ck, bucket: e.bucket, n: e.n, d: e.d, bulk: e.bulk})
				e.n, e.d = 0, 0
				e.dirty = false
			}
			clear(s.dirty[len(keep):])
			s.dirty = keep
			s.minEnd = minEnd
		}
		if i == p.sweepNext {
			var bulk int64
			released += int64(s.tab.removeIf(func(e *entry) bool {
				idle := !e.dirty && nowMs-e.end >= p.idleMs
				if idle && e.bulk {
					bulk++
				}
				return idle
			}))
			p.bulk.Add(-bulk)
		}
		s.mu.Unlock()
		if i%8 == 7 {
			// Let the requests in: on a server with one core (GOMAXPROCS 1) a flush of
			// thousands of records would otherwise hold it for milliseconds, the p99 of
			// every call waiting behind it.
			runtime.Gosched()
		}
	}
	p.sweepNext = (p.sweepNext + 1) % numShards
	p.buffered.Add(-released)
	p.noIdle.Store(false) // the drained counters are idle now

	p.sendAll(batch, room)
	clear(batch)
	p.batch = batch[:0]
	if !all {
		p.siteHeartbeat(nowMs, watermark)
	}

	if p.metrics != nil {
		p.metrics.flushSeconds.Observe(p.cfg.Clock.Now().Sub(start).Seconds())
	}
	p.logDrops()
	if errs := p.produceErrs.Swap(0); errs > 0 {
		if now := p.cfg.Clock.Now(); now.Sub(p.lastLog) >= 10*time.Second || now.Before(p.lastLog) {
			p.lastLog = now
			var last error
			if e := p.lastErr.Load(); e != nil {
				last = *e
			}
			p.cfg.Logger.Warn("producer: Kafka did not take hits; keeping them merged for a retry",
				"failed_records", errs, "unsent_hits", p.unsentHits.Load(),
				"buffered_keys", p.buffered.Load(), "err", last)
		}
	}
}

// dropReasonText explains each reason in the dropped-hits log.
var dropReasonText = [numDropReasons]string{
	dropNoRoom:       "new counters while MaxBufferedKeys counters all held hits not yet sent (no idle counter to evict)",
	dropKafkaBacklog: "Kafka could not take counts and the buffer of counts waiting for it was full",
	dropClosed:       "hits after Close",
	dropBulkNoRoom:   "bulk hits (RLQS usage reports) while bulk counters and counts held their part of MaxBufferedKeys",
}

// logDrops logs, at most every 10 s, the hits dropped since the last such log, by reason.
// The caller holds flushMu.
func (p *Producer) logDrops() {
	now := p.cfg.Clock.Now()
	if !p.dropLogAt.IsZero() && now.Sub(p.dropLogAt) < 10*time.Second && !now.Before(p.dropLogAt) {
		return
	}
	var by [numDropReasons]int64
	for i := range p.shards {
		for r := range by {
			by[r] = satAdd(by[r], p.shards[i].dropped[r].Load())
		}
	}
	for r, n := range by {
		if d := n - p.dropLogged[r]; d > 0 {
			p.dropLogAt = now
			p.cfg.Logger.Info("producer: hits dropped", "reason", dropReasons[r], "hits", d,
				"why", dropReasonText[r], "buffered_keys", p.buffered.Load(), "max_buffered_keys", p.maxKeys)
		}
		p.dropLogged[r] = n
	}
}

// outRecord is one record handed to the Kafka client together with the count it carries
// and the bytes of its key and value, so that producing a record costs one allocation at
// most, none once the pool is warm. The client returns the *kgo.Record to the promise,
// which finds the outRecord around it.
type outRecord struct {
	kr   kgo.Record // first field: a *kgo.Record of an outRecord is the outRecord's address
	rec  record
	recs []record // the counts of a hit batch (sendAll); rec is unused then
	buf  []byte
}

// send hands r to the Kafka client.
func (p *Producer) send(r record) {
	h := topics.Hit{Key: r.ck.key, Site: p.cfg.Site, BucketStart: r.bucket, Window: r.ck.window, Count: r.n, Denied: r.d}
	o := p.outRecord()
	buf := append(o.buf[:0], r.ck.key...)
	buf, err := h.AppendBinary(buf)
	if err != nil {
		// Unreachable: HitAt validated the key and window, New the site.
		p.cfg.Logger.Error("producer: encoding a hit", "key", r.ck.key, "err", err)
		return
	}
	o.buf, o.rec = buf, r
	k := len(r.ck.key)
	o.kr = kgo.Record{Topic: p.cfg.Topic, Key: buf[:k:k], Value: buf[k:], Headers: p.proof(buf[k:])}
	p.inflightRecs.Add(1)
	p.inflightHits.add(r.n)
	p.cl.TryProduce(context.Background(), &o.kr, p.produced)
}

// onProduced is the promise of every record send and sendAll hand to Kafka.
func (p *Producer) onProduced(kr *kgo.Record, err error) {
	o := (*outRecord)(unsafe.Pointer(kr))
	recs := o.recs
	if len(recs) == 0 {
		recs = []record{o.rec} // does not escape: no allocation
	}
	p.inflightRecs.Add(-int64(len(recs)))
	for _, r := range recs {
		p.inflightHits.add(-r.n)
	}
	if err == nil {
		p.recordsOut.Add(int64(len(recs)))
		if len(o.recs) > 0 {
			p.batchesOut.Add(1)
		}
		p.bytesOut.Add(int64(len(kr.Key) + len(kr.Value)))
	} else {
		// With the idempotent producer, kgo fails a record only when it is sure the
		// broker did not write it (never sent, or an error response), so the counts can be
		// merged back without risk of counting them twice.
		p.produceErrs.Add(1)
		p.lastErr.Store(&err)
		for _, r := range recs {
			p.keepUnsent(r)
		}
	}
	clear(o.recs)
	o.kr, o.rec, o.recs = kgo.Record{}, record{}, o.recs[:0]
	if cap(o.buf) <= 2*maxBatchBytes {
		p.outFree.Put(o)
	}
}

// keepUnsent merges r into the counts waiting for Kafka. A count that needs a new slot
// when the bound is full takes the slot of an idle counter; failing that it is dropped
// and counted (DropKafkaBacklog). Counts of one bucket that would overflow int64 together
// are kept apart.
func (p *Producer) keepUnsent(r record) {
	p.unsentMu.Lock()
	defer p.unsentMu.Unlock()
	rk := recordKey{ck: r.ck, bucket: r.bucket}
	for {
		c, ok := p.unsent[rk]
		if !ok {
			if r.bulk && !p.takeBulk() {
				p.shards[0].drop(dropBulkNoRoom, r.n)
				return
			}
			if !p.reserve() && !p.evictAnyIdle(p.cfg.Clock.Now().UnixMilli()) {
				if r.bulk {
					p.bulk.Add(-1)
				}
				p.shards[0].drop(dropKafkaBacklog, r.n)
				return
			}
			c.bulk = r.bulk
		} else if c.n+c.d > math.MaxInt64-r.n-r.d {
			rk.part++
			continue
		}
		c.n += r.n
		c.d += r.d
		p.unsent[rk] = c
		p.unsentHits.add(r.n)
		return
	}
}

// evictAnyIdle frees the slot of an idle counter of any shard that is not busy (the
// bound is global, the shards' sizes vary): for a new counter whose own shard has none
// idle, or for a count waiting for Kafka (the counts of counters that carry traffic come
// before the allocation-free path of idle ones). A shard whose lock the caller holds is
// skipped.
func (p *Producer) evictAnyIdle(nowMs int64) bool {
	if p.noIdle.Load() {
		return false // nothing was idle anywhere, and only a flush makes counters idle
	}
	for i := range p.shards {
		s := &p.shards[i]
		if !s.mu.TryLock() {
			continue
		}
		ok := p.evictIdle(s, nowMs, false)
		s.mu.Unlock()
		if ok {
			return true
		}
	}
	p.noIdle.Store(true)
	return false
}

// Flush hands every pending count to Kafka, the current buckets included, and waits until
// Kafka has acknowledged or failed them, or ctx is done. Counts of the current buckets that
// keep receiving hits after Flush drained them become further records. It returns nil when
// nothing is left unsent, an *UndeliveredError describing what is (kept for a later
// retry), or ErrClosed after Close.
func (p *Producer) Flush(ctx context.Context) error {
	if p.closed.Load() {
		return ErrClosed
	}
	return p.flushWait(ctx)
}

func (p *Producer) flushWait(ctx context.Context) error {
	p.flush(true)
	err := p.cl.Flush(ctx)
	p.unsentMu.Lock()
	recs := int64(len(p.unsent))
	p.unsentMu.Unlock()
	if recs += p.inflightRecs.Load(); recs > 0 || err != nil {
		hits := satAdd(p.unsentHits.Load(), p.inflightHits.Load())
		if err == nil {
			if e := p.lastErr.Load(); e != nil {
				err = *e
			} else {
				err = errors.New("kafka client buffer full")
			}
		}
		return &UndeliveredError{Hits: hits, Records: recs, Err: err}
	}
	return nil
}

// Close stops the background flush, refuses further hits (they are dropped and counted),
// and delivers everything pending, retrying until it is acknowledged or ctx is done: give
// ctx a deadline, since Close waits for an unreachable Kafka until then. Once everything is
// delivered, it writes a site leave record (topics.SiteLeaveKey) to every partition of the
// hits topic, unless site heartbeats are off, so that every data center stops reserving
// room for this instance at once rather than after it is found silent. It closes the
// Kafka client if the Producer built it. It returns nil when everything was delivered, an
// *UndeliveredError with the hits it could not deliver, or ErrClosed if already closed.
// The Producer's metrics stay registered.
func (p *Producer) Close(ctx context.Context) error {
	if !p.closed.CompareAndSwap(false, true) {
		return ErrClosed
	}
	close(p.stop)
	<-p.done
	var err error
	for {
		out := p.recordsOut.Load()
		err = p.flushWait(ctx)
		if err == nil || ctx.Err() != nil {
			break
		}
		if p.recordsOut.Load() > out {
			continue // progress: more is waiting for room in the client
		}
		select { // Kafka refused everything: pace the retries
		case <-ctx.Done():
		case <-time.After(20 * time.Millisecond):
		}
	}
	if err == nil {
		p.leave(ctx)
	}
	var ue *UndeliveredError
	if errors.As(err, &ue) && ctx.Err() != nil && !errors.Is(ue.Err, ctx.Err()) {
		ue.Err = fmt.Errorf("%w (last produce error: %v)", ctx.Err(), ue.Err)
	}
	if p.ownClient {
		p.cl.Close()
	}
	p.cfg.Logger.Info("producer: closed", "records_out", p.recordsOut.Load(), "err", err)
	return err
}
