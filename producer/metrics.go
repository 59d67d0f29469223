package producer

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// Stats is a snapshot of a Producer's counters, the same numbers as its metrics.
type Stats struct {
	// HitsIn is the sum of n over accepted Hit calls (hits_in_total).
	HitsIn int64
	// DroppedHits is the sum of n over hits dropped by the memory bound or after Close
	// (dropped_hits_total, all reasons).
	DroppedHits int64
	// DroppedByReason splits DroppedHits by reason: DropNoRoom, DropKafkaBacklog,
	// DropClosed, DropBulkNoRoom (dropped_hits_total{reason}).
	DroppedByReason map[string]int64
	// InvalidHits is the number of Hit calls ignored for invalid input
	// (invalid_hits_total).
	InvalidHits int64
	// RecordsOut is the number of hit records Kafka acknowledged (records_out_total): one
	// per (key, window, bucket) count, whether it travelled alone or in a hit batch.
	RecordsOut int64
	// BatchesOut is the number of hit batch records among them (topics.HitBatchKey), each
	// carrying several counts (hit_batches_out_total).
	BatchesOut int64
	// SiteHeartbeatsOut is the number of site heartbeats Kafka acknowledged
	// (site_heartbeats_out_total).
	SiteHeartbeatsOut int64
	// BytesOut is the key plus value bytes of the Kafka records that carried them
	// (bytes_out_total).
	BytesOut int64
	// BufferedKeys is the number of (key, window, bucket) slots held against
	// MaxBufferedKeys: known counters, parked finished buckets and unsent counts
	// (buffered_keys).
	BufferedKeys int64
	// UnsentHits is the sum of the counts that Kafka could not take yet (unsent_hits).
	UnsentHits int64
	// InFlightRecords and InFlightHits are the records handed to the Kafka client and not
	// yet acknowledged or failed, and the hits they carry (in_flight_records).
	InFlightRecords, InFlightHits int64
	// Flushes counts drains, background and explicit.
	Flushes int64
}

// Stats returns a snapshot of p's counters. It is safe to call at any time, also after
// Close.
func (p *Producer) Stats() Stats {
	var s Stats
	var by [numDropReasons]int64
	for i := range p.shards {
		sh := &p.shards[i]
		sh.mu.Lock()
		s.HitsIn = satAdd(s.HitsIn, sh.hitsIn)
		sh.mu.Unlock()
		for r := range by {
			by[r] = satAdd(by[r], sh.dropped[r].Load())
		}
		s.InvalidHits += sh.invalid.Load()
	}
	s.DroppedByReason = make(map[string]int64, len(by))
	for r, n := range by {
		s.DroppedByReason[dropReasons[r]] = n
		s.DroppedHits = satAdd(s.DroppedHits, n)
	}
	s.RecordsOut = p.recordsOut.Load()
	s.BatchesOut = p.batchesOut.Load()
	s.SiteHeartbeatsOut = p.heartbeatsOut.Load()
	s.BytesOut = p.bytesOut.Load()
	s.BufferedKeys = p.buffered.Load()
	s.UnsentHits = p.unsentHits.Load()
	s.InFlightRecords = p.inflightRecs.Load()
	s.InFlightHits = p.inflightHits.Load()
	s.Flushes = p.flushes.Load()
	return s
}

type metrics struct {
	flushSeconds prometheus.Histogram
}

// newMetrics registers p's metrics on reg. Counters and gauges read the Producer's own
// atomics when scraped, so Hit pays nothing for them.
func newMetrics(p *Producer, reg prometheus.Registerer) (*metrics, error) {
	const ns, sub = "streamlimit", "producer"
	m := &metrics{
		flushSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "flush_duration_seconds",
			Help:    "Time to drain buffered counts and hand them to the Kafka client (on the producer's clock).",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 9),
		}),
	}
	counter := func(name, help string, f func(Stats) int64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help},
			func() float64 { return float64(f(p.Stats())) })
	}
	gauge := func(name, help string, f func(Stats) int64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help},
			func() float64 { return float64(f(p.Stats())) })
	}
	cs := []prometheus.Collector{
		m.flushSeconds,
		counter("hits_in_total", "Hits accepted by Hit (sum of n).", func(s Stats) int64 { return s.HitsIn }),
		counter("invalid_hits_total", "Hit calls ignored for invalid key, window or n.", func(s Stats) int64 { return s.InvalidHits }),
		counter("records_out_total", "Hit records (one per key, window and bucket) acknowledged by Kafka, alone or in hit batches.", func(s Stats) int64 { return s.RecordsOut }),
		counter("hit_batches_out_total", "Hit batch records (several hit records of one partition in one Kafka record) acknowledged by Kafka.", func(s Stats) int64 { return s.BatchesOut }),
		counter("site_heartbeats_out_total", "Site heartbeats acknowledged by Kafka.", func(s Stats) int64 { return s.SiteHeartbeatsOut }),
		counter("bytes_out_total", "Key plus value bytes of acknowledged records.", func(s Stats) int64 { return s.BytesOut }),
		gauge("buffered_keys", "(key, window, bucket) slots held against MaxBufferedKeys.", func(s Stats) int64 { return s.BufferedKeys }),
		gauge("unsent_hits", "Hits Kafka could not take yet, kept for a retry.", func(s Stats) int64 { return s.UnsentHits }),
		gauge("in_flight_records", "Records handed to the Kafka client and not yet acknowledged.", func(s Stats) int64 { return s.InFlightRecords }),
	}
	for _, r := range dropReasons {
		cs = append(cs, prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "dropped_hits_total",
			Help:        "Hits dropped (sum of n), by reason: no_room (a new counter while the buffer bound was full of counters holding unsent hits), kafka_backlog (Kafka could not take them and its waiting buffer was full), closed (after Close), bulk_no_room (bulk hits: RLQS usage reports, past their part of the buffer bound).",
			ConstLabels: prometheus.Labels{"reason": r}},
			func() float64 { return float64(p.Stats().DroppedByReason[r]) }))
	}
	var done []prometheus.Collector
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			for _, d := range done {
				reg.Unregister(d)
			}
			return nil, errors.Join(err)
		}
		done = append(done, c)
	}
	return m, nil
}
