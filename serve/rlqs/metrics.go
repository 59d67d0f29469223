package rlqs

import (
	"errors"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the Server's Prometheus series, all under streamlimit_rlqs_.
type metrics struct {
	streams       prometheus.Gauge
	buckets       prometheus.Gauge
	messages      prometheus.Counter
	reports       prometheus.Counter
	allowed       prometheus.Counter
	denied        prometheus.Counter
	actions       *prometheus.CounterVec // by strategy
	abandoned     prometheus.Counter
	invalid       *prometheus.CounterVec // by reason
	ignoredLimits prometheus.Counter
	unmatchedBkts prometheus.Counter
	drainingBkts  prometheus.Gauge
	// The bounds of the Server's memory and streams (Options.MaxBytes and the rest).
	refusedBkts    *prometheus.CounterVec // by bound
	refusedStreams *prometheus.CounterVec // by bound
	cut            *prometheus.CounterVec // by reason
	memory         prometheus.Gauge

	// actionBy caches actions' series by kind (kindNone: abandon), each made at its first
	// use, so that a message's count spares the label's lookup.
	actionBy [kindPerUnit + 1]atomic.Pointer[prometheus.Counter]
}

// Strategy labels of streamlimit_rlqs_actions_total.
var strategyLabels = [...]string{kindNone: "none", kindAllow: "allow_all", kindDeny: "deny_all", kindTokens: "token_bucket", kindPerUnit: "requests_per_time_unit"}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	opts := func(name, help string) prometheus.Opts {
		return prometheus.Opts{Namespace: "streamlimit", Subsystem: "rlqs", Name: name, Help: help}
	}
	m := &metrics{
		streams:   prometheus.NewGauge(prometheus.GaugeOpts(opts("streams", "Open StreamRateLimitQuotas streams (one per Envoy and RLQS cluster host)."))),
		buckets:   prometheus.NewGauge(prometheus.GaugeOpts(opts("buckets", "Buckets held for open streams."))),
		messages:  prometheus.NewCounter(prometheus.CounterOpts(opts("report_messages_total", "Usage report messages received."))),
		reports:   prometheus.NewCounter(prometheus.CounterOpts(opts("bucket_reports_total", "Bucket usage reports received (a message carries one per bucket)."))),
		allowed:   prometheus.NewCounter(prometheus.CounterOpts(opts("allowed_requests_total", "Requests the clients reported as allowed: counted and published as hits."))),
		denied:    prometheus.NewCounter(prometheus.CounterOpts(opts("denied_requests_total", "Requests the clients reported as denied: published as demand."))),
		actions:   prometheus.NewCounterVec(prometheus.CounterOpts(opts("actions_total", "Bucket actions sent, by strategy (token_bucket, requests_per_time_unit, deny_all, allow_all) or abandon.")), []string{"strategy"}),
		abandoned: prometheus.NewCounter(prometheus.CounterOpts(opts("abandoned_total", "Buckets abandoned because their clients reported no request for AbandonAfter."))),
		invalid:   prometheus.NewCounterVec(prometheus.CounterOpts(opts("invalid_total", "Reports and streams refused, by reason (no_domain, domain_changed, no_bucket_id, malformed, count_too_large).")), []string{"reason"}),
		ignoredLimits: prometheus.NewCounter(prometheus.CounterOpts(opts("ignored_limits_total",
			"Limits of local or site scope that matched a bucket: only global limits are assigned through RLQS."))),
		unmatchedBkts: prometheus.NewCounter(prometheus.CounterOpts(opts("unlimited_buckets_total", "Buckets that no global limit applies to, assigned ALLOW_ALL."))),
		drainingBkts:  prometheus.NewGauge(prometheus.GaugeOpts(opts("draining_buckets", "Buckets of closed streams whose last assignment has not expired yet: still reserved."))),
		refusedBkts: prometheus.NewCounterVec(prometheus.CounterOpts(opts("refused_buckets_total",
			"Bucket reports refused, left without an assignment (the client applies its no_assignment_behavior), by bound: stream (--rlqs-max-stream-buckets), addr (a client address's eighth of the RLQS part of --max-memory), memory (the RLQS part).")), []string{"bound"}),
		refusedStreams: prometheus.NewCounterVec(prometheus.CounterOpts(opts("refused_streams_total",
			"Streams refused with RESOURCE_EXHAUSTED, by bound: per_addr (--rlqs-max-streams-per-addr), addr (a client address's eighth of the RLQS part of --max-memory), memory (the RLQS part).")), []string{"bound"}),
		cut: prometheus.NewCounterVec(prometheus.CounterOpts(opts("streams_cut_total",
			"Streams the server ended, by reason: idle (no report for --rlqs-stream-idle-timeout), not_reading (a response not taken for --rlqs-send-timeout).")), []string{"reason"}),
		memory: prometheus.NewGauge(prometheus.GaugeOpts(opts("memory_bytes", "Bytes the streams and buckets keep alive, by the estimate that the RLQS part of --max-memory bounds."))),
	}
	cs := []prometheus.Collector{m.streams, m.buckets, m.messages, m.reports, m.allowed, m.denied, m.actions, m.abandoned, m.invalid, m.ignoredLimits, m.unmatchedBkts, m.drainingBkts,
		m.refusedBkts, m.refusedStreams, m.cut, m.memory}
	if reg != nil {
		for i, c := range cs {
			if err := reg.Register(c); err != nil {
				var are prometheus.AlreadyRegisteredError
				if !errors.As(err, &are) {
					return nil, err
				}
				// A second Server on the same registry (tests, a restart in process)
				// shares the first one's series.
				cs[i] = are.ExistingCollector
			}
		}
		m.streams, m.buckets = cs[0].(prometheus.Gauge), cs[1].(prometheus.Gauge)
		m.messages, m.reports, m.allowed, m.denied = cs[2].(prometheus.Counter), cs[3].(prometheus.Counter), cs[4].(prometheus.Counter), cs[5].(prometheus.Counter)
		m.actions, m.abandoned, m.invalid = cs[6].(*prometheus.CounterVec), cs[7].(prometheus.Counter), cs[8].(*prometheus.CounterVec)
		m.ignoredLimits, m.unmatchedBkts, m.drainingBkts = cs[9].(prometheus.Counter), cs[10].(prometheus.Counter), cs[11].(prometheus.Gauge)
		m.refusedBkts, m.refusedStreams, m.cut, m.memory = cs[12].(*prometheus.CounterVec), cs[13].(*prometheus.CounterVec), cs[14].(*prometheus.CounterVec), cs[15].(prometheus.Gauge)
	}
	return m, nil
}

// action returns the series of streamlimit_rlqs_actions_total of actions of kind k
// (kindNone: abandon).
func (m *metrics) action(k kind) prometheus.Counter {
	if c := m.actionBy[k].Load(); c != nil {
		return *c
	}
	label := strategyLabels[k]
	if k == kindNone {
		label = "abandon"
	}
	c := m.actions.WithLabelValues(label)
	m.actionBy[k].Store(&c)
	return c
}
