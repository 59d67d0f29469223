package e2e_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/streamlimit/streamlimit/internal/testenv"
)

// tiersRules: a pool of 200 per 10 s that free requests may fill to half; paid users have
// a base of 20 that stretches to 60 while the pool is below half full.
const tiersRules = `
domain: api
pools:
  - name: all
    rate_limit: {window: 10s, requests_per_unit: 200}
    priorities: {paid: 100, free: 50}
descriptors:
  - key: plan
    value: paid
    priority: paid
    descriptors:
      - key: user
        rate_limit: {window: 10s, requests_per_unit: 20, pool: all, elastic: {max: 60, until: 50}}
  - key: plan
    value: free
    priority: free
    descriptors:
      - key: user
        rate_limit: {window: 10s, requests_per_unit: 1000, pool: all}
`

// Pools, priorities and elastic limits across three sites on the real broker: an idle
// system gives a paid user its elastic room, free users are held to their part of the
// pool, and paid requests still pass once free ones are refused.
func TestTiersOnRealKafka(t *testing.T) {
	tp := startTopology(t, topologyOptions{brokers: testenv.Brokers(t), rules: tiersRules})
	client := &http.Client{Timeout: 5 * time.Second}
	next := 0
	// send makes n requests of user on plan, round robin over the enforcers at rate per
	// second, and returns how many were admitted.
	send := func(plan, user string, n int, rate float64) int {
		ok := 0
		body := fmt.Sprintf(`{"domain":"api","descriptors":[{"entries":[{"key":"plan","value":%q},{"key":"user","value":%q}]}]}`, plan, user)
		tick := time.NewTicker(time.Duration(float64(time.Second) / rate))
		defer tick.Stop()
		for range n {
			<-tick.C
			nd := tp.nodes[next%len(tp.nodes)]
			next++
			resp, err := client.Post("http://"+nd.addr+"/v1/check", "application/json", bytes.NewReader([]byte(body)))
			if err != nil {
				t.Fatal(err)
			}
			var r struct {
				OverallCode string `json:"overall_code"`
			}
			err = json.NewDecoder(resp.Body).Decode(&r)
			resp.Body.Close()
			if err != nil {
				t.Fatal(err)
			}
			if r.OverallCode == "OK" {
				ok++
			}
		}
		return ok
	}
	// 1. Idle system: the paid user gets more than its base of 20, up to its elastic 60.
	elastic := send("paid", "p1", 90, 30)
	t.Logf("FIGURE tiers: idle pool, paid user p1 (base 20, elastic 60): %d of 90 admitted", elastic)
	if elastic < 35 || elastic > 64 {
		t.Errorf("idle pool: paid user admitted %d of 90, want its elastic room (35..64: more than the base 20, at most 60 + lag)", elastic)
	}
	// 2. Free users fill the pool up to their half (100 of 200), p1's admissions included.
	free := 0
	for i := range 40 {
		free += send("free", fmt.Sprintf("f%d", i), 4, 60)
	}
	t.Logf("FIGURE tiers: free users, 160 requests with the pool at %d: %d admitted (free may fill 100)", elastic, free)
	if elastic+free > 110 || free < 15 {
		t.Errorf("free users admitted %d with %d paid in the pool: want the pool at most about half full (≤ 110 in all) and free not shut out (≥ 15)", free, elastic)
	}
	// 3. Free requests are now refused while paid ones pass.
	lateFree := send("free", "f-late", 10, 20)
	paid := send("paid", "p2", 15, 20)
	t.Logf("FIGURE tiers: pool past free's half: free %d of 10, paid %d of 15 admitted", lateFree, paid)
	if lateFree > 2 || paid < 12 {
		t.Errorf("past free's part of the pool: free admitted %d of 10 (want ≤ 2), paid %d of 15 (want ≥ 12)", lateFree, paid)
	}
}
