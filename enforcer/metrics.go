package enforcer

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/streamlimit/streamlimit/enforcer/rules"
)

// maxDetailedSeries bounds the per-value series of detailed_metric rules in one Engine:
// the values of requests are in the hands of whoever sends them, so past this many
// distinct keys further values are counted under the key "other".
const maxDetailedSeries = 1000

type metrics struct {
	decisions *prometheus.CounterVec
	// detailed counts the decisions of detailed_metric rules per descriptor value, keyed
	// by the counter key without its window; detailedKeys holds the keys given a series.
	detailed     *prometheus.CounterVec
	detailedMu   sync.Mutex
	detailedKeys map[string]struct{}
	shadow       *prometheus.CounterVec
	fallback     *prometheus.CounterVec
	// reserved counts global caps computed with room reserved for a silent site.
	reserved prometheus.Counter
	// unknownDomain counts requests of a domain no rule configures.
	unknownDomain prometheus.Counter
	// waiting, waited and awaited measure Engine.Await: requests waiting now, how long
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
		detailed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "streamlimit", Subsystem: "enforcer", Name: "detailed_decisions_total",
			Help: fmt.Sprintf("Decisions per descriptor of rules with detailed_metric, by domain, rule, key (the counter key without its window, so one series per value; \"other\" past %d keys) and result.", maxDetailedSeries),
		}, []string{"domain", "rule", "key", "result"}),
		detailedKeys: make(map[string]struct{}),
		shadow: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "streamlimit", Subsystem: "enforcer", Name: "shadow_denials_total",
			Help: "Limits of shadow-mode rules that would have denied, by rule.",
		}, []string{"rule"}),
		fallback: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "streamlimit", Subsystem: "enforcer", Name: "fallback_decisions_total",
			Help: "Decisions made by a fallback: reason redis (site store down) or stale (snapshot too old).",
		}, []string{"reason"}),
	}
	m.reserved = prometheus.NewCounter(prometheus.CounterOpts{Namespace: "streamlimit", Subsystem: "enforcer", Name: "silent_site_reservations_total",
		Help: "Global caps computed with room reserved for a silent site (cut off, or crashed within --crash-hold): not fallbacks, but less room here."})
	m.unknownDomain = prometheus.NewCounter(prometheus.CounterOpts{Namespace: "streamlimit", Subsystem: "enforcer", Name: "unknown_domain_requests_total",
		Help: "Requests of a domain that no rule configures, admitted with no limit or denied as --unknown-domain says (the domain is logged, at most once a second)."})
	m.waiting = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "streamlimit", Subsystem: "enforcer", Name: "waiting_requests",
		Help: "Requests waiting for room instead of being refused (Await)."})
	m.waited = prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "streamlimit", Subsystem: "enforcer", Name: "wait_seconds",
		Help: "How long requests that waited for room waited.", Buckets: prometheus.ExponentialBuckets(0.001, 4, 10)})
	m.awaited = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "streamlimit", Subsystem: "enforcer", Name: "waits_total",
		Help: "Waits for room by outcome: admitted, gave_up (room not due within the delay), canceled (the client went away), queue_full."},
		[]string{"outcome"})
	m.cache.Store(&map[decisionKey]*ruleCounters{})
	if reg != nil {
		for _, c := range []prometheus.Collector{m.decisions, m.detailed, m.shadow, m.fallback, m.reserved, m.unknownDomain, m.waiting, m.waited, m.awaited} {
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
		result := 0
		switch {
		case st.Code == CodeOverLimit:
			result = 1
		case st.Shadow:
			result = 2
		case st.Soft():
			result = 3
		}
		m.inc(rc, result)
		if st.Rule.DetailedMetric {
			m.detail(domain, st, result)
		}
		if st.Fallback && st.Limit != nil && st.Limit.Scope == rules.Global {
			m.fallback.WithLabelValues("stale").Inc()
		}
	}
}

// detail counts a decision of a detailed_metric rule in its value's series.
func (m *metrics) detail(domain string, st *Status, result int) {
	key := st.Key
	if i := strings.LastIndexByte(key, '#'); i >= 0 {
		key = key[:i]
	}
	if key == "" {
		key = st.Rule.ID // an unlimited rule has no counter
	}
	m.detailedMu.Lock()
	if _, ok := m.detailedKeys[key]; !ok {
		if len(m.detailedKeys) >= maxDetailedSeries {
			key = "other"
		} else {
			m.detailedKeys[key] = struct{}{}
		}
	}
	m.detailedMu.Unlock()
	m.detailed.WithLabelValues(domain, st.Rule.ID, key, resultName(result)).Inc()
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

// siteStates reports, at scrape time, how many sites a global decision takes to be in each
// state (sharing.classify): fresh, cut (silent with every site of its data center), crashed
// (silent while others of its data center speak) or left.
type siteStates struct {
	l    *Engine
	desc *prometheus.Desc
}

func (c *siteStates) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *siteStates) Collect(ch chan<- prometheus.Metric) {
	var n [4]float64
	if sn := c.l.cfg.Snapshot; sn != nil {
		now := c.l.cfg.Clock.Now().UnixMilli()
		for _, st := range sn.SiteTimes().Sites() {
			state, _ := c.l.share.classify(now, &st)
			n[state]++
		}
	}
	for state := range n {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, n[state], siteState(state).String())
	}
}
