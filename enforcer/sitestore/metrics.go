package sitestore

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	calls        *prometheus.CounterVec
	errors       prometheus.Counter
	breakerState prometheus.Gauge
	fallback     *prometheus.CounterVec
	counterFB    *prometheus.CounterVec
	canceled     prometheus.Counter
	writtenBack  prometheus.Counter
	overLimit    prometheus.Counter
	batches      prometheus.Counter
	duration     prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	const ns, sub = "streamlimit", "redis"
	m := &metrics{
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "calls_total",
			Help: "Script calls to Redis (site-scope decisions and global-scope site counts), by result (ok, error, timeout; canceled: the caller gave up first; writing_back: decided in process while another call wrote hits back)."}, []string{"result"}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "errors_total",
			Help: "Redis script calls (site-scope decisions and global-scope site counts) that failed or timed out."}),
		breakerState: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "breaker_state",
			Help: "Redis circuit breaker: 0 closed, 1 open, 2 half-open."}),
		fallback: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "fallback_decisions_total",
			Help: "Site-scope requests decided in process instead of in Redis, by reason (error, timeout, breaker_open, out_of_range, writing_back, return_hold)."}, []string{"reason"}),
		counterFB: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "counter_fallback_total",
			Help: "Global-scope site-count calls answered by the in-process counter instead of Redis, by op (counts, commit) and reason (error, timeout, breaker_open)."}, []string{"op", "reason"}),
		canceled: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "canceled_total",
			Help: "Requests whose caller gave up before Redis answered: refused without taking anything, and not counted as fallback decisions."}),
		writtenBack: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "written_back_total",
			Help: "Batches of hits admitted in process during a Redis outage, written back to Redis before it decided again (one batch per counter and outage)."}),
		overLimit: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "over_limit_cached_total",
			Help: "Site-scope requests of one hit refused without a Redis call: Redis had refused a hit of each of their counters, and none can admit one before that answer's retry time."}),
		batches: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "batches_total",
			Help: "Batch script calls sent to Redis, each carrying the requests of one or more calls (calls_total over batches_total: the requests per batch)."}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "call_duration_seconds",
			Help:    "Duration of Redis script calls (site-scope decisions and global-scope site counts), including failed ones.",
			Buckets: []float64{50e-6, 100e-6, 200e-6, 500e-6, 1e-3, 2e-3, 5e-3, 10e-3, 20e-3, 50e-3, 100e-3, 250e-3}}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.calls, m.errors, m.breakerState, m.fallback, m.counterFB, m.canceled, m.writtenBack, m.overLimit, m.batches, m.duration} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("sitestore: registering metrics: %w", err)
		}
	}
	return m, nil
}
