package enforcer

import (
	"errors"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/streamlimit/streamlimit/enforcer/rules"
)

type metrics struct {
	decisions *prometheus.CounterVec
	shadow    *prometheus.CounterVec
	fallback  *prometheus.CounterVec

	// Resolving a labelled child costs a hash of the labels; decisions are cached per
	// (rule, result) so that the hot path only increments.
	mu    sync.RWMutex
	cache map[decisionKey]prometheus.Counter
}

type decisionKey struct {
	domain string
	rule   *rules.Rule
	code   Code
	shadow bool
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "streamlimit", Subsystem: "enforcer", Name: "decisions_total",
			Help: "Decisions per descriptor, by domain, rule and result (ok, over_limit, shadow_over_limit).",
		}, []string{"domain", "rule", "result"}),
		shadow: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "streamlimit", Subsystem: "enforcer", Name: "shadow_denials_total",
			Help: "Limits of shadow-mode rules that would have denied, by rule.",
		}, []string{"rule"}),
		fallback: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "streamlimit", Subsystem: "enforcer", Name: "fallback_decisions_total",
			Help: "Decisions made by a fallback: reason redis (site store down) or stale (snapshot too old).",
		}, []string{"reason"}),
		cache: make(map[decisionKey]prometheus.Counter),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.decisions, m.shadow, m.fallback} {
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
		k := decisionKey{domain: domain, rule: st.Rule, code: st.Code, shadow: st.Shadow}
		m.mu.RLock()
		c, ok := m.cache[k]
		m.mu.RUnlock()
		if !ok {
			result := "ok"
			switch {
			case st.Code == CodeOverLimit:
				result = "over_limit"
			case st.Shadow:
				result = "shadow_over_limit"
			}
			c = m.decisions.WithLabelValues(domain, st.Rule.ID, result)
			m.mu.Lock()
			if len(m.cache) > 1<<16 {
				// Rules are reloaded as new pointers; drop stale children's cache entries.
				clear(m.cache)
			}
			m.cache[k] = c
			m.mu.Unlock()
		}
		c.Inc()
		if st.Fallback && st.Limit != nil && st.Limit.Scope == rules.Global {
			m.fallback.WithLabelValues("stale").Inc()
		}
	}
}

func (m *metrics) shadowDenied(_ *rules.Limit, r *rules.Rule) {
	if r != nil {
		m.shadow.WithLabelValues(r.ID).Inc()
	}
}
