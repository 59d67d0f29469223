package enforcer_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/streamlimit/streamlimit/clock"
	"github.com/streamlimit/streamlimit/enforcer"
	"github.com/streamlimit/streamlimit/enforcer/rules"
)

// TestDetailedMetric checks envoyproxy/ratelimit's detailed_metric: a rule with it gets a
// decision series per descriptor value, bounded by maxDetailedSeries (further values are
// counted as "other"); a rule without it gets none.
func TestDetailedMetric(t *testing.T) {
	cfg, err := rules.Parse("rules.yaml", []byte(`
domain: api
descriptors:
  - key: user
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 1, scope: local}
  - key: ip
    rate_limit: {unit: minute, requests_per_unit: 1, scope: local}
`))
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	l, err := enforcer.New(enforcer.Config{Rules: rules.Static(cfg), Site: "t",
		Clock: clock.NewFake(time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)), Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	decide := func(key, value string) {
		l.Decide(context.Background(), enforcer.Request{Domain: "api", Descriptors: [][]rules.Entry{{{Key: key, Value: value}}}})
	}
	decide("user", "a")
	decide("user", "a")
	decide("user", "b")
	decide("ip", "192.0.2.1")
	for i := range enforcer.MaxDetailedSeries + 3 {
		decide("user", "u"+strconv.Itoa(i))
	}
	series := map[string]float64{}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "streamlimit_enforcer_detailed_decisions_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			var key, result, rule string
			for _, lp := range m.GetLabel() {
				switch lp.GetName() {
				case "key":
					key = lp.GetValue()
				case "result":
					result = lp.GetValue()
				case "rule":
					rule = lp.GetValue()
				}
			}
			if rule != "api.user" {
				t.Errorf("a series for rule %s, which has no detailed_metric", rule)
			}
			series[key+" "+result] += m.GetCounter().GetValue()
		}
	}
	for k, want := range map[string]float64{"api|user=a ok": 1, "api|user=a over_limit": 1, "api|user=b ok": 1, "other ok": 5} {
		if series[k] != want {
			t.Errorf("series %q = %v, want %v", k, series[k], want)
		}
	}
	if n := len(series); n > enforcer.MaxDetailedSeries+2 {
		t.Errorf("%d series, want at most maxDetailedSeries keys", n)
	}
}
