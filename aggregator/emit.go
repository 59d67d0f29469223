package aggregator

import (
	"context"
	"errors"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamlimit/streamlimit/topics"
)

// publishLoop publishes the counts that are due every EmitInterval, and the heartbeats
// every HeartbeatInterval or when a replay ends (hbNow). One goroutine does both, and a
// heartbeat round publishes the counts that are due first, chosen under the same lock as the
// heartbeats, which report a site left only once the counts of its last hits are out
// (state.siteMaps): an enforcer never learns that a site left before it sees those hits.
func (a *Aggregator) publishLoop(ctx context.Context, cl *kgo.Client) {
	emit := time.NewTicker(a.cfg.EmitInterval)
	defer emit.Stop()
	hb := time.NewTicker(a.cfg.HeartbeatInterval)
	defer hb.Stop()
	var sc emitScratch
	for {
		withHeartbeats := false
		select {
		case <-ctx.Done():
			return
		case <-emit.C:
		case <-hb.C:
			withHeartbeats = true
		case <-a.hbNow:
			withHeartbeats = true
		}
		a.emitRound(ctx, cl, &sc, withHeartbeats)
	}
}

// emitScratch is an emission round's working memory, kept from round to round.
type emitScratch struct {
	cands []candidate
	outs  []emission
	buf   []byte
	hbs   []topics.Heartbeat
}

// emitRound publishes the counts that are due (docs/aggregator.md, "Emission"), then, with
// withHeartbeats, a heartbeat of every assigned partition that is positioned and not
// replaying, to every partition of the counts topic; nothing while Run is leaving the group.
// A partition that replays gets no heartbeat: the latest heartbeat of a partition is then
// always from an owner whose counts of it are complete (the previous owner's while a new
// one replays), and says how fresh they are.
func (a *Aggregator) emitRound(ctx context.Context, cl *kgo.Client, sc *emitScratch, withHeartbeats bool) {
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
	sc.hbs = sc.hbs[:0]
	if withHeartbeats {
		sc.hbs = a.heartbeats(now, sc.hbs)
		a.skew.update(now, a.m, a.log)
	}
	lags := a.lagReports(now)
	n := a.countsParts
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
	for _, hb := range sc.hbs {
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
	for i := range lags {
		cl.Produce(ctx, &lags[i], a.produced)
	}
}

// lagReports returns, when one is due (skews.reportDue), this instance's lag report (skew.go) as a
// record for each partition it owns of the local hits topic, positioned and not
// replaying: the owner of the same partition in every other data center reads it there.
// The caller holds a.mu.
func (a *Aggregator) lagReports(now int64) []kgo.Record {
	if !a.skew.reportDue(now) {
		return nil
	}
	v, err := a.skew.lagReport(now, a.cfg.InstanceID).MarshalBinary()
	if err != nil {
		a.log.Error("encode lag report", "err", err)
		return nil
	}
	var out []kgo.Record
	for k, ps := range a.parts {
		if k.topic != a.cfg.LocalTopic || ps.fresh || ps.replaying {
			continue
		}
		out = append(out, kgo.Record{Topic: k.topic, Partition: k.part, Key: []byte(topics.LagReportKey), Value: v})
	}
	return out
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

// heartbeats appends a heartbeat of every assigned partition that is positioned and not
// replaying to hbs, reports site conflicts and prunes the re-routed records seen. The caller
// holds a.mu.
func (a *Aggregator) heartbeats(now int64, hbs []topics.Heartbeat) []topics.Heartbeat {
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
	a.st.pruneSeen(now)
	return hbs
}
