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
	heartbeats prometheus.Counter
	// siteHeartbeats counts the site heartbeats consumed from the hits topics.
	siteHeartbeats prometheus.Counter
	// siteLeaves counts the site leave records consumed from the hits topics.
	siteLeaves prometheus.Counter
	// siteConflicts is the number of sites announced by instances that count apart.
	siteConflicts prometheus.Gauge
}

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
			Help: "Hits dropped because MaxKeys counters (or dedupe entries) were already held."}),
		siteConflicts: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "site_conflicts",
			Help: "Sites that two or more live instances announce while counting apart (at least one in its own process)."}),
		siteHeartbeats: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "site_heartbeats_total",
			Help: "Site heartbeats consumed from the hits topics (each says a site was alive up to its time)."}),
		siteLeaves: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "site_leaves_total",
			Help: "Site leave records consumed from the hits topics (each says an instance of a site stopped cleanly)."}),
		heartbeats: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "heartbeats_total",
			Help: "Heartbeat records published."}),
	}
	for _, r := range append(topics.Reasons(), ReasonTooFarFuture, ReasonTooOld, ReasonWindowTooLong) {
		m.bad.WithLabelValues(r)
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.lag, m.keys, m.recordsIn, m.countsOut, m.tombstones, m.emitDur,
			m.bad, m.replayDur, m.rerouted, m.duplicates, m.refused, m.heartbeats, m.siteHeartbeats, m.siteLeaves, m.siteConflicts} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("aggregator: register metrics: %w", err)
			}
		}
	}
	return m, nil
}
