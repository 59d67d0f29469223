package aggregator

import (
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/streamlimit/streamlimit/topics"
)

// ErrRefused is returned by Memory.Add for a hit refused for want of room. Memory has no
// re-routed hits to remember, and a new counter while MaxKeys are held evicts the least
// recently hit (evicted_keys_total), so it is not returned today; it is kept for callers
// that test for it.
var ErrRefused = errors.New("aggregator: counter refused: MaxKeys reached")

// BadHitError is returned by Memory.Add for a hit that the aggregator skips; Reason is its
// bad_records_total label (a topics.Reason, ReasonTooFarFuture, ReasonTooOld or
// ReasonWindowTooLong).
type BadHitError struct {
	Reason string
	Err    error // the validation error, when there is one
}

func (e *BadHitError) Error() string {
	if e.Err != nil {
		return "aggregator: bad hit (" + e.Reason + "): " + e.Err.Error()
	}
	return "aggregator: bad hit (" + e.Reason + ")"
}

func (e *BadHitError) Unwrap() error { return e.Err }

// Emission is one record the aggregator would publish to the counts topic: Key is the
// record key (a counter key, or a heartbeat key), Value the binary encoded topics.Count or
// topics.Heartbeat, or nil for a tombstone. It is exactly what snapshot.Snapshot.Apply
// takes.
type Emission struct {
	Key   []byte
	Value []byte
}

// Memory is the aggregator's counting without Kafka: hits go in through Add, counts come
// out of Emit, computed by the same state, validation and emission rule as an Aggregator
// that owns every partition (docs/aggregator.md). It is for the accuracy
// simulator and tests, which drive time explicitly: every method takes now, and Memory
// never reads a clock. A Memory is not safe for concurrent use.
type Memory struct {
	counting
	cfg    Config
	src    topics.Heartbeat
	sc     emitScratch
	added  int64
	lastHB int64 // ms of the last heartbeat, when hbDone
	hbDone bool
}

// NewMemory validates cfg and returns an empty Memory. Only the counting fields of cfg are
// used (SubBuckets, SiteForget, MaxLocalHold, EmitInterval,
// MaxEmitPerSecond, HeartbeatInterval, Lateness, MaxClockSkew, MaxKeys, DefaultWindow,
// MaxWindow, CountsFormat, InstanceID, Registerer), with the same defaults; the Kafka fields are
// ignored. Memory has no loop: the caller calls Emit, normally every EmitInterval, and
// Emit returns at most MaxEmitPerSecond × EmitInterval counts. Its heartbeats describe
// partition 0 of each topic heard from (LocalTopic at least); InstanceID defaults to
// "memory". Hits added with Add are the local ones, held back behind those added with
// AddFrom another topic by up to MaxLocalHold.
func NewMemory(cfg Config) (*Memory, error) {
	if cfg.InstanceID == "" {
		cfg.InstanceID = "memory"
	}
	full := cfg
	// normalize requires a broker; Memory never connects, so any name will do.
	full.Brokers, full.KafkaOpts = []string{"in-memory"}, nil
	full, err := full.normalize()
	if err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	return &Memory{
		counting: newCounting(&full, m),
		cfg:      full,
		src:      topics.Heartbeat{Instance: full.InstanceID, Topic: full.LocalTopic},
	}, nil
}

// Add counts hit h at aggregator time now, as the Kafka path counts a hit record consumed
// at now from the partition of the local hits topic (Config.LocalTopic) that owns its key.
// A hit the aggregator would skip returns a *BadHitError (invalid fields, too far in the
// future, too old, window too long), counted in the metrics as on the Kafka path; a hit of
// a new counter while MaxKeys are held evicts the least recently hit counter. A hit older than every
// bucket the counter still holds is ignored. Site records (heartbeats and leaves) are
// recorded for their source, as the Kafka path does.
func (m *Memory) Add(now time.Time, h topics.Hit) error { return m.AddFrom(now, m.cfg.LocalTopic, h) }

// AddFrom is Add for a hit consumed from topic: the local hits topic (Config.LocalTopic),
// or another data center's, replicated here ("<dc>.hits"), whose lag is what local hits
// are held back by. A held local hit is counted at a later Add, AddFrom or Emit. Site
// records are recorded per topic, as they are per source partition on the Kafka path, and Emit writes
// a heartbeat for each topic heard from.
func (m *Memory) AddFrom(now time.Time, topic string, h topics.Hit) error {
	m.release(now.UnixMilli())
	if err := h.Validate(); err != nil {
		m.m.bad.WithLabelValues(topics.Reason(err)).Inc()
		return &BadHitError{Reason: topics.Reason(err), Err: err}
	}
	ms := now.UnixMilli()
	remote := m.cfg.remote(topic)
	if h.IsSiteRecord() {
		if reason := m.cfg.checkSiteHeartbeat(ms, h.BucketStart, time.Time{}); reason != "" {
			m.m.bad.WithLabelValues(reason).Inc()
			return &BadHitError{Reason: reason}
		}
		m.m.recordsIn.Inc()
		m.take(ms, topic, remote, false, siteHeld(topic, m.src.Partition, h))
		return nil
	}
	ref := hitRef{key: []byte(h.Key), site: []byte(h.Site), bucketStart: h.BucketStart, window: h.Window, count: h.Count, denied: h.Denied}
	if reason := m.cfg.checkHit(ms, &ref, time.Time{}); reason != "" {
		m.m.bad.WithLabelValues(reason).Inc()
		return &BadHitError{Reason: reason}
	}
	m.m.recordsIn.Inc()
	m.added++
	if m.take(ms, topic, remote, false, held{slot: m.src.Partition, h: ref}) == refusedKey {
		return ErrRefused
	}
	return nil
}

// Emit returns the records due at now, in the order the aggregator would publish them:
// the counts and tombstones of one emission round (docs/aggregator.md), then
// a heartbeat for each source (partition 0 of LocalTopic and of every topic a site record
// came from) if HeartbeatInterval has passed since the last ones (the first Emit always
// includes them). The returned slice and its values are
// the caller's.
func (m *Memory) Emit(now time.Time) []Emission {
	ms := now.UnixMilli()
	m.collect(ms, m.cfg.emitBudget(), &m.sc)
	out := make([]Emission, 0, len(m.sc.outs)+1)
	for i := range m.sc.outs {
		e := &m.sc.outs[i]
		rec := Emission{Key: []byte(e.key)}
		v, err := m.encode(&m.cfg, nil, e)
		if err != nil {
			// Unreachable: the state produces valid counts. Skip it, as Run does.
			continue
		}
		if e.count != nil {
			rec.Value = v
		}
		out = append(out, rec)
	}
	clear(m.sc.outs)
	if !m.hbDone || ms-m.lastHB >= m.cfg.HeartbeatInterval.Milliseconds() {
		m.hbDone, m.lastHB = true, ms
		m.skew.update(ms, m.m, m.cfg.Logger)
		conflicts := m.st.conflicts(ms)
		m.m.siteConflicts.Set(float64(len(conflicts)))
		srcs := m.st.sourcesOf(m.src.Partition)
		if !slices.ContainsFunc(srcs, func(s tp) bool { return s.topic == m.src.Topic }) {
			srcs = append(srcs, tp{topic: m.src.Topic, part: m.src.Partition})
		}
		slices.SortFunc(srcs, func(a, b tp) int { return strings.Compare(a.topic, b.topic) })
		for _, src := range srcs {
			hb := m.src
			hb.Topic, hb.AsOf, hb.Offset, hb.HighWatermark, hb.Conflicts = src.topic, ms, m.added, m.added, conflicts
			hb.Sites, hb.Left = m.st.siteMaps(src, ms)
			if v, err := hb.MarshalBinary(); err == nil {
				m.m.heartbeats.Inc()
				out = append(out, Emission{Key: []byte(topics.HeartbeatKey(hb.Topic, hb.Partition)), Value: v})
			}
		}
	}
	return out
}

// LagReport returns the lag report (topics.LagReport, encoded) that an Aggregator would
// write at now to its local hits topic, for the caller to deliver to the other data
// centers' aggregators (AddLagReport) as replication would, or nil when none is due: an
// Aggregator writes one every two seconds, every half second while it has no estimate of
// some remote data center's sites (every emission round of the defaults). Call it every
// EmitInterval.
func (m *Memory) LagReport(now time.Time) []byte {
	if !m.skew.reportDue(now.UnixMilli()) {
		return nil
	}
	v, err := m.skew.lagReport(now.UnixMilli(), m.cfg.InstanceID).MarshalBinary()
	if err != nil {
		return nil // unreachable: what the state measured is valid
	}
	return v
}

// AddLagReport takes a lag report (value, encoded) consumed at now from topic, another
// data center's hits topic replicated here: with what this Memory measured of the sites,
// it tells the clock offset of that data center's sites, by which their records are
// re-dated (docs/aggregator.md, "Clock offsets"). A report that does not decode is
// refused as a bad record is; one from the local topic changes nothing.
func (m *Memory) AddLagReport(now time.Time, topic string, value []byte) error {
	rep, err := topics.DecodeLagReport(value)
	if err != nil {
		m.m.bad.WithLabelValues(topics.Reason(err)).Inc()
		return &BadHitError{Reason: topics.Reason(err), Err: err}
	}
	m.skew.report(now.UnixMilli(), topic, rep)
	return nil
}

// ClockOffset returns by how much the records of site read from topic are re-dated into
// this aggregator's clock (the site's estimated offset behind it, with the least local
// hop; negative: ahead), as of the latest Emit that wrote heartbeats; false when there is
// no estimate (yet).
func (m *Memory) ClockOffset(topic, site string) (time.Duration, bool) {
	d, ok := m.skew.shift[topic][site]
	return time.Duration(d) * time.Millisecond, ok
}

// Keys returns the number of counters held.
func (m *Memory) Keys() int { return m.st.size() }
