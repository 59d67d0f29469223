package enforcer

import (
	"errors"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/streamlimit/streamlimit/enforcer/rules"
)

type metrics struct {
	decisions *prometheus.CounterVec
	shadow    *prometheus.CounterVec
	fallback  *prometheus.CounterVec
	// waiting, waited and awaited measure Limiter.Await: requests waiting now, how long
	// they waited, and how their waits ended.
	waiting prometheus.Gauge
	waited  prometheus.Histogram
	awaited *prometheus.CounterVec

	// Resolving a labelled child costs a hash of the labels; the children are cached per
	// (domain, rule) so that the hot path only increments. The cache is copied on write
	// (new rules are rare: a reload) so that a read takes no lock, whose shared counter
	// would bounce between cores on every decision.
	mu    sync.Mutex // serializes writers of cache
	cache atomic.Pointer[map[decisionKey]*ruleCounters]
	// last is the most recently used entry of cache: most traffic hits few rules, and
	// comparing two pointers and a string is cheaper than hashing them.
	last atomic.Pointer[ruleCounters]
}

type decisionKey struct {
	domain string
	rule   *rules.Rule
}

// ruleCounters are one (domain, rule)'s decision counters by result, each created when
// first used so that only results that happened are exported.
type ruleCounters struct {
	domain, rule string
	r            *rules.Rule
	c            [4]atomic.Pointer[resultCounter]
}

type resultCounter struct{ prometheus.Counter }

func resultName(result int) string {
	switch result {
	case 1:
		return "over_limit"
	case 2:
		return "shadow_over_limit"
	case 3:
		return "soft"
	}
	return "ok"
}

func (m *metrics) inc(rc *ruleCounters, result int) {
	c := rc.c[result].Load()
	if c == nil {
		c = &resultCounter{m.decisions.WithLabelValues(rc.domain, rc.rule, resultName(result))}
		rc.c[result].Store(c) // a racing writer stores the same child
	}
	c.Inc()
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "streamlimit", Subsystem: "enforcer", Name: "decisions_total",
			Help: "Decisions per descriptor, by domain, rule and result (ok, soft: admitted in the soft band past the hard limit, over_limit, shadow_over_limit).",
		}, []string{"domain", "rule", "result"}),
		shadow: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "streamlimit", Subsystem: "enforcer", Name: "shadow_denials_total",
			Help: "Limits of shadow-mode rules that would have denied, by rule.",
		}, []string{"rule"}),
		fallback: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "streamlimit", Subsystem: "enforcer", Name: "fallback_decisions_total",
			Help: "Decisions made by a fallback: reason redis (site store down) or stale (snapshot too old).",
		}, []string{"reason"}),
	}
	m.waiting = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "streamlimit", Subsystem: "enforcer", Name: "waiting_requests",
		Help: "Requests waiting for room instead of being refused (Await)."})
	m.waited = prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "streamlimit", Subsystem: "enforcer", Name: "wait_seconds",
		Help: "How long requests that waited for room waited.", Buckets: prometheus.ExponentialBuckets(0.001, 4, 10)})
	m.awaited = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "streamlimit", Subsystem: "enforcer", Name: "waits_total",
		Help: "Waits for room by outcome: admitted, gave_up (room not due within the delay), canceled (the client went away), queue_full."},
		[]string{"outcome"})
	m.cache.Store(&map[decisionKey]*ruleCounters{})
	if reg != nil {
		for _, c := range []prometheus.Collector{m.decisions, m.shadow, m.fallback, m.waiting, m.waited, m.awaited} {
			if err := reg.Register(c); err != nil {
				var are prometheus.AlreadyRegisteredError
				if !errors.As(err, &are) {
					return nil, err
				}
			}
		}
	}
	return m, nil
}

func (m *metrics) observe(domain string, res *Result) {
	for i := range res.Statuses {
		st := &res.Statuses[i]
		if st.Rule == nil {
			continue
		}
		rc := m.counters(domain, st.Rule)
		switch {
		case st.Code == CodeOverLimit:
			m.inc(rc, 1)
		case st.Shadow:
			m.inc(rc, 2)
		case st.Soft():
			m.inc(rc, 3)
		default:
			m.inc(rc, 0)
		}
		if st.Fallback && st.Limit != nil && st.Limit.Scope == rules.Global {
			m.fallback.WithLabelValues("stale").Inc()
		}
	}
}

// counters returns the decision counters of (domain, r).
func (m *metrics) counters(domain string, r *rules.Rule) *ruleCounters {
	if rc := m.last.Load(); rc != nil && rc.r == r && rc.domain == domain {
		return rc
	}
	k := decisionKey{domain: domain, rule: r}
	if rc, ok := (*m.cache.Load())[k]; ok {
		m.last.Store(rc)
		return rc
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	old := *m.cache.Load()
	if rc, ok := old[k]; ok {
		return rc
	}
	next := make(map[decisionKey]*ruleCounters, len(old)+1)
	if len(old) < 1<<12 {
		// Rules are reloaded as new pointers; past the bound, start over to drop the stale
		// ones' entries.
		for k2, v := range old {
			next[k2] = v
		}
	}
	rc := &ruleCounters{domain: domain, rule: r.ID, r: r}
	next[k] = rc
	m.cache.Store(&next)
	return rc
}

func (m *metrics) shadowDenied(_ *rules.Limit, r *rules.Rule) {
	if r != nil {
		m.shadow.WithLabelValues(r.ID).Inc()
	}
}
