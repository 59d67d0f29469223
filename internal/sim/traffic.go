package sim

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
)

// Scenario names a traffic shape of the heavy client.
type Scenario string

// The scenarios. In each, the heavy client's requests arrive as a Poisson process whose
// rate is Load × Limit per Window on average (ramp: at the end); what differs is the shape
// over time and the split over sites.
const (
	// Uniform: constant rate, each request at a site drawn uniformly.
	Uniform Scenario = "uniform"
	// Bursty: on/off. ON periods last Exp(mean 1 s), OFF periods Exp(mean 3 s); during
	// ON the rate is 4 × the average, so the average is Load × Limit per Window. Sites
	// uniform.
	Bursty Scenario = "bursty"
	// Skewed: constant rate, sites drawn by fixed weights (SkewWeights): 80/15/5 for
	// three sites, 80/10/5/3/2 for five, 85/15 for two, everything at the site for one.
	Skewed Scenario = "skewed"
	// Ramp: the rate rises linearly over the whole run (warm-up included) from 0.5 ×
	// Limit per Window to Load × Limit per Window. Sites uniform.
	Ramp Scenario = "ramp"
)

// Scenarios returns every scenario, in table order.
func Scenarios() []Scenario { return []Scenario{Uniform, Bursty, Skewed, Ramp} }

// ParseScenario returns the Scenario named s.
func ParseScenario(s string) (Scenario, error) {
	for _, sc := range Scenarios() {
		if string(sc) == s {
			return sc, nil
		}
	}
	return "", fmt.Errorf("sim: unknown scenario %q (want uniform, bursty, skewed or ramp)", s)
}

// SkewWeights returns the share of each site's traffic in the Skewed scenario.
func SkewWeights(sites int) []float64 {
	switch sites {
	case 1:
		return []float64{1}
	case 2:
		return []float64{0.85, 0.15}
	case 3:
		return []float64{0.80, 0.15, 0.05}
	case 5:
		return []float64{0.80, 0.10, 0.05, 0.03, 0.02}
	}
	// Any other count: 80% at the first site, the rest evenly.
	w := make([]float64, sites)
	w[0] = 0.8
	for i := 1; i < sites; i++ {
		w[i] = 0.2 / float64(sites-1)
	}
	return w
}

// Arrival is one request of the heavy client: at T milliseconds since the run's start, at
// site Site (index).
type Arrival struct {
	T    int64
	Site int
}

// Arrivals generates the heavy client's requests for sc over [0, durMs) milliseconds, at an
// average rate of perMs requests per millisecond (Ramp: rising from startPerMs to perMs),
// over sites sites, from rng. Times are whole milliseconds, sorted; several requests may
// share one.
func Arrivals(rng *rand.Rand, sc Scenario, sites int, durMs int64, perMs, startPerMs float64) []Arrival {
	var out []Arrival
	pick := func() int { return rng.IntN(sites) }
	if sc == Skewed {
		w := SkewWeights(sites)
		pick = func() int {
			u := rng.Float64()
			for i, x := range w {
				if u < x {
					return i
				}
				u -= x
			}
			return len(w) - 1
		}
	}
	add := func(t float64) {
		out = append(out, Arrival{T: int64(t), Site: pick()})
	}
	switch sc {
	case Bursty:
		const onMean, offMean = 1000.0, 3000.0
		rate := perMs * (onMean + offMean) / onMean
		t := 0.0
		on := rng.Float64() < onMean/(onMean+offMean)
		for t < float64(durMs) {
			mean := offMean
			if on {
				mean = onMean
			}
			end := t + rng.ExpFloat64()*mean
			if on {
				for a := t + rng.ExpFloat64()/rate; a < end && a < float64(durMs); a += rng.ExpFloat64() / rate {
					add(a)
				}
			}
			t, on = end, !on
		}
	case Ramp:
		// Thinning: candidates at the peak rate, each kept with probability rate(t)/peak.
		peak := max(perMs, startPerMs)
		for a := rng.ExpFloat64() / peak; a < float64(durMs); a += rng.ExpFloat64() / peak {
			r := startPerMs + (perMs-startPerMs)*a/float64(durMs)
			if rng.Float64() < r/peak {
				add(a)
			}
		}
	default: // Uniform, Skewed
		for a := rng.ExpFloat64() / perMs; a < float64(durMs); a += rng.ExpFloat64() / perMs {
			add(a)
		}
	}
	slices.SortStableFunc(out, func(a, b Arrival) int { return int(a.T - b.T) })
	return out
}

// seedFor derives a run's traffic seed from the base seed and the traffic parameters (not
// the lag), so that runs differing only in lag see the same requests.
func seedFor(base uint64, sc Scenario, sites int, load float64) uint64 {
	h := base ^ 0x9e3779b97f4a7c15
	mix := func(v uint64) {
		h ^= v
		h *= 0x100000001b3
		h ^= h >> 29
	}
	for _, c := range []byte(sc) {
		mix(uint64(c))
	}
	mix(uint64(sites))
	mix(math.Float64bits(load))
	return h
}
