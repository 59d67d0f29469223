//go:build !race

// Property runs are one goroutine's computation at scale: -race finds nothing in them and
// makes them ten times slower, so make test runs them in its first, race-free pass.

package algo

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// TestProperties drives each algorithm with random arrivals and sizes and checks what the
// algorithm promises, plus exact retry-after on every rejection.
func TestProperties(t *testing.T) {
	for _, alg := range all {
		for seed := uint64(1); seed <= 4; seed++ {
			t.Run(fmt.Sprintf("%s/%d", alg, seed), func(t *testing.T) {
				r := rand.New(rand.NewPCG(seed, 99))
				l := Limit{Requests: 3 + r.Int64N(20), Window: time.Duration(1+r.Int64N(10)) * time.Second}
				if seed%2 == 0 {
					l.Window += time.Duration(r.Int64N(1e9)) // not a whole second: rates are fractional
					l.Burst = 1 + r.Int64N(30)
					l.SoftPercent = int(r.Int64N(30))
				}
				checkProperties(t, alg, l, r)
			})
		}
	}
}
