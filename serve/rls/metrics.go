package rls

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/streamlimit/streamlimit/enforcer"
)

// Features counted by streamlimit_rls_ignored_total.
const (
	featureOverride = "limit_override"
	featureNegative = "negative_hits"
)

type metrics struct {
	ok, overLimit, invalid prometheus.Counter
	override, negative     prometheus.Counter
	overrides              prometheus.Counter // honoured
	// envoy counts the decisions of the limits that a CompatEnvoy domain counts itself
	// (the Limiter counts the others in streamlimit_enforcer_decisions_total).
	envoy *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "streamlimit", Subsystem: "rls", Name: "requests_total",
		Help: "ShouldRateLimit calls by result: ok, over_limit, or invalid (answered InvalidArgument).",
	}, []string{"result"})
	ignored := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "streamlimit", Subsystem: "rls", Name: "ignored_total",
		Help: "Descriptors that used a feature which was ignored: limit_override (with --limit-overrides=ignore) or negative_hits.",
	}, []string{"feature"})
	overrides := prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "streamlimit", Subsystem: "rls", Name: "limit_overrides_total",
		Help: "Descriptors limited by their own limit (Envoy's per-descriptor override) instead of the rules'.",
	})
	envoy := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "streamlimit", Subsystem: "rls", Name: "envoy_decisions_total",
		Help: "Decisions per descriptor of the rules that a compat: envoy domain counts as envoyproxy/ratelimit does, by domain, rule and result (ok, over_limit, shadow_over_limit, quota_over_limit).",
	}, []string{"domain", "rule", "result"})
	if reg != nil {
		for _, c := range []prometheus.Collector{requests, ignored, overrides, envoy} {
			if err := reg.Register(c); err != nil {
				var are prometheus.AlreadyRegisteredError
				if !errors.As(err, &are) {
					return nil, err
				}
				// A second Server on the same registry (tests, a restart in process)
				// shares the first one's counters.
				switch c {
				case requests:
					requests = are.ExistingCollector.(*prometheus.CounterVec)
				case ignored:
					ignored = are.ExistingCollector.(*prometheus.CounterVec)
				case overrides:
					overrides = are.ExistingCollector.(prometheus.Counter)
				case envoy:
					envoy = are.ExistingCollector.(*prometheus.CounterVec)
				}
			}
		}
	}
	return &metrics{
		ok:        requests.WithLabelValues("ok"),
		overLimit: requests.WithLabelValues("over_limit"),
		invalid:   requests.WithLabelValues("invalid"),
		override:  ignored.WithLabelValues(featureOverride),
		negative:  ignored.WithLabelValues(featureNegative),
		overrides: overrides,
		envoy:     envoy,
	}, nil
}

func (m *metrics) observe(c enforcer.Code) {
	if c == enforcer.CodeOverLimit {
		m.overLimit.Inc()
	} else {
		m.ok.Inc()
	}
}

func (m *metrics) ignored(feature string) {
	if feature == featureOverride {
		m.override.Inc()
	} else {
		m.negative.Inc()
	}
}

// envoyDecision counts one descriptor's decision in a CompatEnvoy domain.
func (m *metrics) envoyDecision(domain, rule string, over, shadow, quota bool) {
	result := "ok"
	switch {
	case quota:
		result = "quota_over_limit"
	case shadow:
		result = "shadow_over_limit"
	case over:
		result = "over_limit"
	}
	m.envoy.WithLabelValues(domain, rule, result).Inc()
}
