package aggregator

import (
	"context"
	"errors"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamlimit/streamlimit/topics"
)

func (a *Aggregator) emitLoop(ctx context.Context, cl *kgo.Client) {
	t := time.NewTicker(a.cfg.EmitInterval)
	defer t.Stop()
	var sc emitScratch
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		a.emitRound(ctx, cl, &sc)
	}
}

// emitScratch is an emission round's working memory, kept from round to round.
type emitScratch struct {
	cands []candidate
	outs  []emission
	buf   []byte
}

// emitRound publishes the counts that are due (see the package documentation), unless Run
// is leaving the group.
func (a *Aggregator) emitRound(ctx context.Context, cl *kgo.Client, sc *emitScratch) {
	a.pubMu.RLock()
	defer a.pubMu.RUnlock()
	start := time.Now()
	now := a.cfg.Clock.Now().UnixMilli()
	a.mu.Lock()
	if a.stopping {
		a.mu.Unlock()
		return
	}
	a.collect(now, a.cfg.emitBudget(), sc)
	a.mu.Unlock()
	for i := range sc.outs {
		e := &sc.outs[i]
		rec := &kgo.Record{Topic: a.cfg.CountsTopic, Key: []byte(e.key), Headers: a.instHeader}
		var err error
		if sc.buf, err = a.encode(&a.cfg, sc.buf[:0], e); err != nil {
			a.log.Error("encode count", "key", e.key, "err", err)
			continue
		}
		if e.count != nil {
			rec.Value = append([]byte(nil), sc.buf...)
		}
		cl.Produce(ctx, rec, a.produced)
	}
	a.m.emitDur.Observe(time.Since(start).Seconds())
}

// produced is the delivery callback of every record the aggregator writes.
func (a *Aggregator) produced(r *kgo.Record, err error) {
	if err != nil {
		if !errors.Is(err, context.Canceled) {
			a.log.Error("publish", "topic", r.Topic, "key", string(r.Key), "err", err)
		}
		return
	}
	if r.Topic == a.cfg.CountsTopic && !topics.IsReservedKey(r.Key) {
		ms := r.Timestamp.UnixMilli()
		for last := a.newestCount.Load(); ms > last && !a.newestCount.CompareAndSwap(last, ms); last = a.newestCount.Load() {
		}
	}
}

func (a *Aggregator) heartbeatLoop(ctx context.Context, cl *kgo.Client) {
	t := time.NewTicker(a.cfg.HeartbeatInterval)
	defer t.Stop()
	var hbs []topics.Heartbeat
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-a.hbNow:
		}
		hbs = a.heartbeatRound(ctx, cl, hbs[:0])
	}
}

// heartbeatRound writes a heartbeat of every assigned partition that is positioned and not
// replaying to every partition of the counts topic, unless Run is leaving the group, and
// returns hbs for reuse. A partition that replays gets none: the latest heartbeat of a
// partition is then always from an owner whose counts of it are complete (the previous
// owner's while a new one replays), and says how fresh they are.
func (a *Aggregator) heartbeatRound(ctx context.Context, cl *kgo.Client, hbs []topics.Heartbeat) []topics.Heartbeat {
	a.pubMu.RLock()
	defer a.pubMu.RUnlock()
	now := a.cfg.Clock.Now().UnixMilli()
	a.mu.Lock()
	if a.stopping {
		a.mu.Unlock()
		return hbs
	}
	conflicts := a.st.conflicts(now)
	a.reportConflicts(now, conflicts)
	for k, ps := range a.parts {
		if ps.fresh || ps.replaying {
			continue
		}
		hb := topics.Heartbeat{Instance: a.cfg.InstanceID, Topic: k.topic, Partition: k.part,
			AsOf: now, Offset: ps.next, HighWatermark: ps.hwm, Conflicts: conflicts}
		hb.Sites, hb.Left = a.st.siteMaps(k, now)
		hbs = append(hbs, hb)
	}
	n := a.countsParts
	a.st.pruneSeen(now)
	a.mu.Unlock()
	for _, hb := range hbs {
		v, err := hb.MarshalBinary()
		if err != nil {
			a.log.Error("encode heartbeat", "err", err)
			continue
		}
		key := []byte(topics.HeartbeatKey(hb.Topic, hb.Partition))
		for p := range n {
			a.m.heartbeats.Inc()
			cl.Produce(ctx, &kgo.Record{Topic: a.cfg.CountsTopic, Key: key, Value: v, Partition: p, Headers: a.instHeader}, a.produced)
		}
	}
	return hbs
}
