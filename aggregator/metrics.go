package aggregator

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/streamlimit/streamlimit/topics"
)

// Reasons for bad_records_total beyond topics.Reasons().
const (
	// ReasonTooFarFuture: the hit's bucket start is more than MaxClockSkew ahead of the
	// aggregator's clock (or of the record's own timestamp).
	ReasonTooFarFuture = "too_far_future"
	// ReasonTooOld: the hit's bucket start is older than its window plus Lateness.
	ReasonTooOld = "too_old"
	// ReasonWindowTooLong: the hit's window exceeds MaxWindow, which recovery could not
	// replay in full.
	ReasonWindowTooLong = "window_too_long"
	// ReasonStrangerLeave: a site leave record from an instance not heard heartbeating
	// under its site on that partition, where other instances of the site were (a forgery,
	// or a leave replayed after its instance was forgotten); it changes nothing. A leave
	// for a site not heard on the partition at all changes nothing either and is not
	// counted: a producer stopped before its heartbeats reached every partition writes it.
	ReasonStrangerLeave = "stranger_leave"
	// ReasonReplayedHeartbeat: a site heartbeat of an instance whose leave was taken on
	// that partition: an old record written again, which would bring back a site that left.
	// It changes nothing.
	ReasonReplayedHeartbeat = "replayed_heartbeat"
	// ReasonUndoneLeave: a site leave record taken from an instance that then heartbeated
	// again, dated later than any of its heartbeats before the leave: the leave was not its
	// last record, so not its own (a forgery naming it), and is undone. Counted when the
	// heartbeat is read, once per leave taken. The first such leave of a site on a
	// partition is reported until then; later ones are held until the heartbeat that undoes
	// them (docs/hardening.md).
	ReasonUndoneLeave = "undone_leave"
)

type metrics struct {
	lag        *prometheus.GaugeVec
	keys       prometheus.Gauge
	recordsIn  prometheus.Counter
	countsOut  prometheus.Counter
	tombstones prometheus.Counter
	emitDur    prometheus.Histogram
	bad        *prometheus.CounterVec
	replayDur  prometheus.Histogram
	rerouted   prometheus.Counter
	duplicates prometheus.Counter
	refused    prometheus.Counter
	// evicted counts the counters evicted to make room for new ones (state.leastRecentlyHit).
	evicted    prometheus.Counter
	heartbeats prometheus.Counter
	// siteHeartbeats counts the site heartbeats consumed from the hits topics.
	siteHeartbeats prometheus.Counter
	// siteLeaves counts the site leave records consumed from the hits topics.
	siteLeaves prometheus.Counter
	// siteConflicts is the number of sites announced by instances that count apart.
	siteConflicts prometheus.Gauge
	// clockOffset is, per remote hits topic, the mean re-dating of its sites' records
	// (skew.go); clockOffsetMax the largest of any remote site's, either way.
	clockOffset    *prometheus.GaugeVec
	clockOffsetMax prometheus.Gauge

	// The consumer group (group.go): events and partitions by event (assigned, revoked,
	// lost; events also waiting, a rebalance that waits for members, and left), how long
	// each JoinGroup took (a rebalance waits there for every member), whether one is
	// waiting now, and the partitions replaying.
	groupEvents     *prometheus.CounterVec
	groupPartitions *prometheus.CounterVec
	joinDur         prometheus.Histogram
	joinWaiting     prometheus.Gauge
	replaying       prometheus.Gauge
}

// The values of the event label of group_events_total and group_partitions_total.
const (
	eventAssigned = "assigned"
	eventRevoked  = "revoked"
	eventLost     = "lost"
	eventWaiting  = "waiting"
	eventLeft     = "left"
)

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	const ns, sub = "streamlimit", "aggregator"
	m := &metrics{
		lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "consume_lag_records",
			Help: "High watermark minus next offset to consume, per assigned hits partition."}, []string{"topic", "partition"}),
		keys: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "keys",
			Help: "Counters ((key, window) pairs) held in memory."}),
		recordsIn: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "records_in_total",
			Help: "Hit records consumed, good or bad."}),
		countsOut: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "counts_out_total",
			Help: "Count records published (tombstones included)."}),
		tombstones: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "tombstones_total",
			Help: "Tombstones published for counters that fell to zero."}),
		emitDur: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "emit_duration_seconds",
			Help: "Time to select and enqueue one round of count emissions.", Buckets: prometheus.ExponentialBuckets(0.0001, 4, 8)}),
		bad: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "bad_records_total",
			Help: "Hit records skipped, by reason."}, []string{"reason"}),
		replayDur: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "replay_duration_seconds",
			Help: "Time from a partition's assignment to the end of its replay.", Buckets: prometheus.ExponentialBuckets(0.01, 4, 9)}),
		rerouted: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "rerouted_total",
			Help: "Misrouted hits re-published to the partition that owns their key."}),
		duplicates: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "rerouted_duplicates_total",
			Help: "Re-routed hits skipped because a copy with the same origin was already counted."}),
		refused: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "refused_keys_total",
			Help: "Re-routed hits dropped because MaxKeys dedupe entries were already held (a full table of counters evicts instead)."}),
		evicted: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "evicted_keys_total",
			Help: "Counters evicted, the least recently hit of a sample, to make room for a new counter while MaxKeys were held (the evicted counter's last published count stays in the enforcers' snapshots until its window passes)."}),
		siteConflicts: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "site_conflicts",
			Help: "Sites that two or more live instances announce while counting apart (at least one in its own process)."}),
		clockOffset: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "clock_offset_seconds",
			Help: "Estimated offset of a remote data center's sites' clocks behind this data center's sites' (their mean; negative: ahead), by which their records are re-dated; 0 until both data centers' lag reports are in."}, []string{"topic"}),
		clockOffsetMax: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "clock_offset_max_seconds",
			Help: "The largest estimated clock offset, either way, of any remote site against this data center's sites (bounded to clock.MaxAhead)."}),
		siteHeartbeats: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "site_heartbeats_total",
			Help: "Site heartbeats consumed from the hits topics (each says a site was alive up to its time)."}),
		siteLeaves: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "site_leaves_total",
			Help: "Site leave records consumed from the hits topics (each says an instance of a site stopped cleanly)."}),
		heartbeats: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "heartbeats_total",
			Help: "Heartbeat records published."}),
		groupEvents: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "group_events_total",
			Help: "Consumer group events: partitions assigned, revoked (handed over in a rebalance), lost (taken away without a handover: session expired), waiting (a rebalance waited for members longer than a heartbeat interval allows for), left (left the group on shutdown)."}, []string{"event"}),
		groupPartitions: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "group_partitions_total",
			Help: "Hits partitions assigned, revoked and lost."}, []string{"event"}),
		joinDur: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "group_join_duration_seconds",
			Help: "Time from sending a JoinGroup to its answer: a rebalance waits there until every member has joined (a member that died without leaving, until its session times out).", Buckets: prometheus.ExponentialBuckets(0.005, 3, 9)}),
		joinWaiting: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "group_rebalance_waiting",
			Help: "1 while this member's JoinGroup has waited for other members longer than a live member takes to join."}),
		replaying: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "replaying_partitions",
			Help: "Assigned hits partitions being replayed (their slots publish nothing until done)."}),
	}
	for _, e := range []string{eventAssigned, eventRevoked, eventLost, eventWaiting, eventLeft} {
		m.groupEvents.WithLabelValues(e)
	}
	for _, e := range []string{eventAssigned, eventRevoked, eventLost} {
		m.groupPartitions.WithLabelValues(e)
	}
	for _, r := range append(topics.Reasons(), ReasonTooFarFuture, ReasonTooOld, ReasonWindowTooLong, ReasonStrangerLeave, ReasonReplayedHeartbeat, ReasonUndoneLeave) {
		m.bad.WithLabelValues(r)
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.lag, m.keys, m.recordsIn, m.countsOut, m.tombstones, m.emitDur,
			m.bad, m.replayDur, m.rerouted, m.duplicates, m.refused, m.evicted, m.heartbeats, m.siteHeartbeats, m.siteLeaves, m.siteConflicts,
			m.clockOffset, m.clockOffsetMax,
			m.groupEvents, m.groupPartitions, m.joinDur, m.joinWaiting, m.replaying} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("aggregator: register metrics: %w", err)
			}
		}
	}
	return m, nil
}

// newestCountAgeGauge is streamlimit_aggregator_newest_count_age_seconds, read from age at
// each scrape. It is registered by the Kafka Aggregator only: Memory publishes nothing.
func newestCountAgeGauge(age func() float64) prometheus.GaugeFunc {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "streamlimit", Subsystem: "aggregator", Name: "newest_count_age_seconds",
		Help: "Seconds since the newest count record (or tombstone) this aggregator published was acknowledged by Kafka, or since it started when it has published none: grows while it publishes nothing (no partitions, replaying, stuck, or every count it owns steady for up to half its window)."},
		age)
}
