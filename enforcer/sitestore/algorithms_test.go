package sitestore

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/streamlimit/streamlimit/enforcer/algo"
	"github.com/streamlimit/streamlimit/enforcer/rules"
	"github.com/streamlimit/streamlimit/internal/testenv"
)

// TestEveryAlgorithmRegistered walks package algo's algorithms: each has a Redis
// implementation here (in the script, deciding on the real Redis) or a reason in
// notInRedis, and the rules parser accepts its name in local and site scope. An algorithm
// added to one side only fails here.
func TestEveryAlgorithmRegistered(t *testing.T) {
	s := newStore(t, testenv.RedisClient(t), testenv.KeyPrefix(t), nil)
	for _, a := range algo.Algorithms() {
		name := fmt.Sprintf("%v (calendar %v)", a, a.Calendar())
		for _, scope := range []string{"local", "site"} {
			// A calendar variant is what align: calendar makes of its unit.
			limit := fmt.Sprintf("unit: second, algorithm: %v", a)
			if cal := a.Calendar(); cal != algo.Epoch {
				limit = fmt.Sprintf("unit: %v, align: calendar", cal)
			}
			src := fmt.Sprintf("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {requests_per_unit: 5, scope: %s, %s}\n", scope, limit)
			c, err := rules.Parse("reg.yaml", []byte(src))
			if err != nil {
				t.Errorf("%s in %s scope: rejected by the rules parser: %v", name, scope, err)
				continue
			}
			if got := c.Match("d", []rules.Entry{{Key: "k", Value: "v"}}).Limits[0].Algorithm; got != a {
				t.Errorf("%s in %s scope: the rules parser made it %v (calendar %v)", name, scope, got, got.Calendar())
			}
		}
		sa, inRedis := siteAlgorithms[a]
		reason, excused := notInRedis[a]
		switch {
		case inRedis && excused:
			t.Errorf("%s is registered in Redis and also excused (%q)", name, reason)
			continue
		case excused && reason == "":
			t.Errorf("%s: notInRedis gives no reason", name)
			continue
		case excused:
			continue
		case !inRedis:
			t.Errorf("%s has no Redis implementation (siteAlgorithms) and no reason in notInRedis", name)
			continue
		}
		if sa.lua == "" || sa.src == "" || sa.args == nil || sa.decide == nil {
			t.Errorf("%s: incomplete Redis registration", name)
			continue
		}
		if !strings.Contains(siteScript, fmt.Sprintf("algos['%d'] = %s\n", a, sa.lua)) {
			t.Errorf("%s: the script does not map code %d to %s", name, a, sa.lua)
		}
		op := algo.Op{Key: fmt.Sprintf("d|k=%d#1s", a), Algorithm: a, Limit: algo.Limit{Requests: 1, Window: time.Second}, N: 1}
		out := make([]algo.Decision, 1)
		if ok, fb := s.AllowAll(context.Background(), t0, []algo.Op{op}, out); !ok || fb {
			t.Errorf("%s: first request in Redis: allowed %v fellBack %v", name, ok, fb)
		}
		if ok, fb := s.AllowAll(context.Background(), t0, []algo.Op{op}, out); ok || fb {
			t.Errorf("%s: second request of 1 per second in Redis: allowed %v fellBack %v", name, ok, fb)
		}
	}
}
