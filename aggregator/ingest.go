package aggregator

import (
	"context"
	"errors"
	"strconv"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamlimit/streamlimit/topics"
)

// lockChunk is how many records are counted under one hold of a.mu: few enough that
// emission and heartbeats wait a millisecond or two at most, many enough that taking the
// lock costs nothing per record.
const lockChunk = 4096

// maxBatchScratch is the most hits Aggregator.batchHits keeps room for between records:
// some ten times a producer's hit batch (at most 16 KiB), 448 KiB; a larger batch is read
// into room of its own.
const maxBatchScratch = 8192

// count counts recs, part of fp. The caller holds no lock.
func (a *Aggregator) count(ctx context.Context, cl *kgo.Client, now int64, fp *kgo.FetchTopicPartition, recs []*kgo.Record) {
	a.mu.Lock()
	defer a.mu.Unlock()
	ps := a.parts[tp{fp.Topic, fp.Partition}]
	if ps == nil || ps.fresh {
		// Revoked or lost (whoever owns the partition next reads these records again), or
		// not positioned yet.
		return
	}
	nparts := a.nparts[fp.Topic]
	n := 0
	for _, r := range recs {
		n += a.process(ctx, cl, now, ps, nparts, r)
		ps.next = r.Offset + 1
	}
	a.m.recordsIn.Add(float64(n))
	if fp.HighWatermark > 0 {
		ps.hwm = fp.HighWatermark
	}
	a.m.lag.WithLabelValues(fp.Topic, strconv.Itoa(int(fp.Partition))).Set(float64(max(ps.hwm-ps.next, 0)))
	a.checkReplayDone(fp.Partition, ps)
}

// process handles one hit record, and returns the number of hit records it held: one, or
// the hits of a hit batch. The caller holds a.mu.
// nparts is the partition count of the record's topic (0: unknown, no re-routing).
func (a *Aggregator) process(ctx context.Context, cl *kgo.Client, now int64, ps *partState, nparts int32, r *kgo.Record) int {
	if topics.IsLagReport(r.Key) {
		rep, err := topics.DecodeLagReport(r.Value)
		if err != nil {
			a.bad(ctx, cl, topics.Reason(err), r, err)
			return 1
		}
		if !ps.replaying {
			a.skew.report(now, r.Topic, rep)
		}
		return 0 // not a hit record
	}
	origin := ""
	for _, h := range r.Headers {
		if h.Key == topics.HeaderRerouted {
			origin = string(h.Value)
			if origin == "" {
				origin = "?"
			}
		}
	}
	if topics.IsHitBatch(r.Value) {
		// Several hits of one site, each counted as a record of its own would be; a batch
		// that does not decode whole is skipped whole.
		site, hits, err := topics.AppendBatchHits(a.batchHits[:0], r.Value)
		if err == nil {
			err = a.authenticate(site, r)
		}
		if err != nil {
			clear(hits)
			a.bad(ctx, cl, topics.Reason(err), r, err)
			return 1
		}
		for i := range hits {
			bh := &hits[i]
			h := hitRef{key: bh.Key, site: site, bucketStart: bh.BucketStart, window: bh.Window, count: bh.Count, denied: bh.Denied}
			o := origin
			if o != "" {
				o += "#" + strconv.Itoa(i)
			}
			a.processHit(ctx, cl, now, ps, nparts, r, h, o, i)
		}
		// The hits point into the record: let it go once counted.
		clear(hits)
		if cap(hits) <= maxBatchScratch {
			a.batchHits = hits
		}
		return len(hits)
	}
	var h hitRef
	var bh topics.BatchHit
	if site, ok := topics.ReadHit(r.Value, &bh); ok {
		h = hitRef{key: bh.Key, site: site, bucketStart: bh.BucketStart, window: bh.Window, count: bh.Count}
		if err := a.authenticate(site, r); err != nil {
			a.bad(ctx, cl, topics.Reason(err), r, err)
			return 1
		}
	} else {
		slow, err := topics.DecodeHit(r.Value)
		if err == nil {
			err = a.authenticate([]byte(slow.Site), r)
		}
		if err != nil {
			a.bad(ctx, cl, topics.Reason(err), r, err)
			return 1
		}
		if slow.IsSiteRecord() {
			a.siteRecord(ctx, cl, now, ps, r, slow)
			return 1
		}
		h = hitRef{key: []byte(slow.Key), site: []byte(slow.Site), bucketStart: slow.BucketStart, window: slow.Window, count: slow.Count, denied: slow.Denied}
	}
	a.processHit(ctx, cl, now, ps, nparts, r, h, origin, -1)
	return 1
}

// processHit counts hit h of record r: the record itself when i < 0, else the i-th hit of
// the hit batch r. The caller holds a.mu.
func (a *Aggregator) processHit(ctx context.Context, cl *kgo.Client, now int64, ps *partState, nparts int32, r *kgo.Record, h hitRef, origin string, i int) {
	if reason := a.cfg.checkHit(now, &h, r.Timestamp); reason != "" {
		if reason != ReasonTooOld || !ps.replaying { // during replay, old hits are expected, not bad
			a.badHit(ctx, cl, reason, r, &h, i)
		}
		return
	}
	late := a.cfg.Lateness.Milliseconds()
	if origin == "" && nparts > 0 {
		// Ownership follows the counter key (the hit's key), which our producer also uses
		// as the record key, or places the batch by.
		h.hash, h.hashed = topics.Murmur2(h.key), true
		if q := topics.PartitionOfHash(h.hash, nparts); q != r.Partition {
			a.reroute(ctx, cl, r, &h, i, q)
			return
		}
	}
	a.take(now, r.Topic, a.cfg.remote(r.Topic), ps.replaying, held{slot: r.Partition, h: h, origin: origin, expiry: h.bucketStart + h.window + late})
}

// authenticate returns nil when r, a record of site, may be counted: always without
// site keys (Config.SiteKeys), else only when its HeaderSiteMAC proves the site. A
// record the aggregator re-routed keeps or gets a signature of its site's key (reroute).
func (a *Aggregator) authenticate(site []byte, r *kgo.Record) error {
	if a.cfg.SiteKeys == nil {
		return nil
	}
	var mac []byte
	for _, h := range r.Headers {
		if h.Key == topics.HeaderSiteMAC {
			mac = h.Value
			if mac == nil {
				mac = []byte{} // present but empty: wrong, not missing
			}
		}
	}
	return a.cfg.SiteKeys.Verify(site, r.Value, mac)
}

// authFailLogEvery is the least time between two logs of records refused for one reason
// of site authentication: a forger writing thousands a second must not flood the log, and
// the metric counts every one.
const authFailLogEvery = 1_000 // ms

// authFailed logs record r, refused by site authentication for reason, at most once per
// authFailLogEvery per reason, with how many were refused for it since the last log. The
// caller holds a.mu.
func (a *Aggregator) authFailed(reason string, r *kgo.Record, err error) {
	if a.authLog == nil {
		a.authLog = map[string]*authLogState{}
	}
	st := a.authLog[reason]
	if st == nil {
		st = &authLogState{at: -1 << 62}
		a.authLog[reason] = st
	}
	st.since++
	now := a.cfg.Clock.Now().UnixMilli()
	if now-st.at < authFailLogEvery {
		return
	}
	a.log.Warn("hits record refused: it does not prove the site it names", "reason", reason, "topic", r.Topic,
		"partition", r.Partition, "offset", r.Offset, "refused_since_last_log", st.since, "err", err)
	st.at, st.since = now, 0
}

// authLogState is when records refused for one reason were last logged, and how many
// since.
type authLogState struct {
	at    int64
	since int64
}

// siteRecord records that the site of a site heartbeat was heard from on the record's
// partition up to its time, or that an instance of it left (a leave record). Site records
// are not re-routed: producers write one to every partition.
func (a *Aggregator) siteRecord(ctx context.Context, cl *kgo.Client, now int64, ps *partState, r *kgo.Record, h topics.Hit) {
	if reason := a.cfg.checkSiteHeartbeat(now, h.BucketStart, r.Timestamp); reason != "" {
		if reason != ReasonTooOld || !ps.replaying {
			a.bad(ctx, cl, reason, r, nil)
		}
		return
	}
	a.take(now, r.Topic, a.cfg.remote(r.Topic), ps.replaying, siteHeld(r.Topic, r.Partition, h))
}

// siteHeld is site record h of a topic's partition as a held record.
func siteHeld(topic string, part int32, h topics.Hit) held {
	return held{slot: part, site: true, leave: h.IsSiteLeave(), topic: topic, h: hitRef{site: []byte(h.Site), bucketStart: h.BucketStart}, inst: h.Instance, counter: h.Counter}
}

// reportConflicts sets the site_conflicts gauge and logs each conflicting site at error
// level, at most once a minute. The caller holds a.mu.
func (a *Aggregator) reportConflicts(now int64, sites []string) {
	a.m.siteConflicts.Set(float64(len(sites)))
	if len(sites) == 0 || now-a.lastConflictLog < 60_000 {
		return
	}
	a.lastConflictLog = now
	a.log.Error("several instances announce one site but count it apart (at least one in its own process): each admits the site's whole share; give each its own --site, or share the site's Redis",
		"sites", sites)
}

// reroute re-publishes a misrouted hit to partition q (the key's murmur2 partition) of the
// same topic, marked with HeaderRerouted = "<topic>/<partition>/<offset>" of the original,
// and "/<i>" for the i-th hit of a hit batch, which goes as a hit record of its own.
func (a *Aggregator) reroute(ctx context.Context, cl *kgo.Client, r *kgo.Record, h *hitRef, i int, q int32) {
	a.m.rerouted.Inc()
	origin := r.Topic + "/" + strconv.Itoa(int(r.Partition)) + "/" + strconv.FormatInt(r.Offset, 10)
	value := r.Value
	if i >= 0 {
		origin += "/" + strconv.Itoa(i)
		value = h.record()
	}
	hs := make([]kgo.RecordHeader, 0, len(r.Headers)+1)
	for _, rh := range r.Headers {
		if i >= 0 && rh.Key == topics.HeaderSiteMAC {
			continue // signed the batch, not this hit of it: signed again below
		}
		hs = append(hs, rh)
	}
	hs = append(hs, kgo.RecordHeader{Key: topics.HeaderRerouted, Value: []byte(origin)})
	if key, ok := a.cfg.SiteKeys.Key(string(h.site)); ok && i >= 0 {
		// The hit was authenticated as part of its batch; its record of its own is signed
		// with its site's key, which the aggregator holds, so that it is counted again.
		hs = append(hs, kgo.RecordHeader{Key: topics.HeaderSiteMAC, Value: topics.SiteMAC(key, value)})
	}
	rec := &kgo.Record{Topic: r.Topic, Key: h.key, Value: value, Timestamp: r.Timestamp, Headers: hs}
	cl.Produce(context.WithoutCancel(ctx), rec, func(_ *kgo.Record, err error) {
		if err != nil {
			a.log.Error("re-route misrouted hit", "origin", origin, "to_partition", q, "err", err)
		}
	})
}

// record returns h as a hit record's value of its own (binary), for a hit taken out of a
// hit batch; the batch decoded, so it encodes.
func (h *hitRef) record() []byte {
	v, _ := topics.Hit{Key: string(h.key), Site: string(h.site), BucketStart: h.bucketStart, Window: h.window, Count: h.count, Denied: h.denied}.MarshalBinary()
	return v
}

// badHit is bad for hit h of record r: the record itself when i < 0, else the i-th hit of
// the hit batch r, whose dead-letter copy is a hit record of its own.
func (a *Aggregator) badHit(ctx context.Context, cl *kgo.Client, reason string, r *kgo.Record, h *hitRef, i int) {
	if i < 0 {
		a.bad(ctx, cl, reason, r, nil)
		return
	}
	one := *r
	one.Key, one.Value = h.key, h.record()
	a.bad(ctx, cl, reason, &one, nil)
}

func (a *Aggregator) bad(ctx context.Context, cl *kgo.Client, reason string, r *kgo.Record, err error) {
	a.m.bad.WithLabelValues(reason).Inc()
	if errors.Is(err, topics.ErrUnsigned) || errors.Is(err, topics.ErrBadSignature) || errors.Is(err, topics.ErrUnknownSite) {
		a.authFailed(reason, r, err)
	} else {
		a.log.Debug("bad hit record", "reason", reason, "topic", r.Topic, "partition", r.Partition, "offset", r.Offset, "err", err)
	}
	if a.cfg.DeadLetterTopic == "" {
		return
	}
	hs := make([]kgo.RecordHeader, 0, len(r.Headers)+1)
	hs = append(hs, r.Headers...)
	hs = append(hs, kgo.RecordHeader{Key: HeaderReason, Value: []byte(reason)})
	rec := &kgo.Record{Topic: a.cfg.DeadLetterTopic, Key: r.Key, Value: r.Value, Timestamp: r.Timestamp, Headers: hs}
	cl.Produce(context.WithoutCancel(ctx), rec, func(_ *kgo.Record, err error) {
		if err != nil {
			a.log.Warn("dead-letter copy", "err", err)
		}
	})
}
