package enforcer

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/streamlimit/streamlimit/enforcer/rules"
)

// A request of a domain that no rule configures is admitted with no limit by default, as
// envoyproxy/ratelimit does, or denied with DenyUnknownDomain; either way it is counted
// and its domain logged, once a second however many arrive, and it counts nothing. A
// configured domain with no matching descriptor is not unknown.
func TestUnknownDomain(t *testing.T) {
	for _, deny := range []bool{false, true} {
		t.Run(map[bool]string{false: "allow", true: "deny"}[deny], func(t *testing.T) {
			var logs bytes.Buffer
			reg := prometheus.NewRegistry()
			pub := &recorder{}
			l, clk := newLimiter(t, localRules, func(c *Config) {
				c.DenyUnknownDomain, c.Registerer, c.Publisher = deny, reg, pub
				c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
			})
			want := CodeOK
			if deny {
				want = CodeOverLimit
			}
			for i := range 10 {
				clk.Advance(300 * time.Millisecond) // 3 s in all: 4 log lines at most
				res := l.Decide(context.Background(), Request{Domain: "apj", Descriptors: [][]rules.Entry{desc("user", "42")}})
				if res.Code != want || len(res.Statuses) != 1 || res.Statuses[0].Code != want {
					t.Fatalf("request %d of domain apj: %+v, want %v", i, res, want)
				}
			}
			if got := testutil.ToFloat64(l.metrics.unknownDomain); got != 10 {
				t.Errorf("unknown_domain_requests_total %v, want 10", got)
			}
			if n := strings.Count(logs.String(), "domain=apj"); n < 2 || n > 4 {
				t.Errorf("%d log lines naming the domain in 3 s, want one a second:\n%s", n, logs.String())
			}
			// A known domain whose descriptor matches no rule is admitted, and not counted.
			if res := l.Decide(context.Background(), Request{Domain: "api", Descriptors: [][]rules.Entry{desc("path", "/")}}); res.Code != CodeOK {
				t.Errorf("known domain, unmatched descriptor: %v", res.Code)
			}
			if got := testutil.ToFloat64(l.metrics.unknownDomain); got != 10 {
				t.Errorf("a known domain counted as unknown: %v", got)
			}
			if len(pub.hits) != 0 || len(pub.denied) != 0 {
				t.Errorf("published %v %v for requests of an unknown domain", pub.hits, pub.denied)
			}
		})
	}
}
