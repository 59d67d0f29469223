package enforcer_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/streamlimit/streamlimit/clock"
	"github.com/streamlimit/streamlimit/enforcer"
	"github.com/streamlimit/streamlimit/enforcer/rules"
)

// TestSoftBand checks a soft limit of 10 per minute with soft_percent 50: the first 10
// requests are admitted plainly, the next 5 in the soft band (Status.Soft, counted as
// result "soft"), the 16th is denied.
func TestSoftBand(t *testing.T) {
	for _, scope := range []string{"local", "site"} {
		t.Run(scope, func(t *testing.T) {
			cfg, err := rules.Parse("rules.yaml", []byte(`
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10, soft_percent: 50, scope: `+scope+`}
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
			req := enforcer.Request{Domain: "api", Descriptors: [][]rules.Entry{{{Key: "user", Value: "1"}}}}
			var soft []bool
			for i := 1; i <= 16; i++ {
				res := l.Decide(context.Background(), req)
				if want := i <= 15; (res.Code == enforcer.CodeOK) != want {
					t.Fatalf("request %d: %v", i, res.Code)
				}
				soft = append(soft, res.Statuses[0].Soft())
			}
			for i, s := range soft {
				if want := i >= 10 && i < 15; s != want {
					t.Errorf("request %d: Soft() = %v, want %v", i+1, s, want)
				}
			}
			c, err := reg.Gather()
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]float64{}
			for _, mf := range c {
				if mf.GetName() != "streamlimit_enforcer_decisions_total" {
					continue
				}
				for _, m := range mf.GetMetric() {
					for _, lp := range m.GetLabel() {
						if lp.GetName() == "result" {
							got[lp.GetValue()] = m.GetCounter().GetValue()
						}
					}
				}
			}
			if got["ok"] != 10 || got["soft"] != 5 || got["over_limit"] != 1 {
				t.Errorf("decisions_total by result %v, want ok 10, soft 5, over_limit 1", got)
			}
		})
	}
}
