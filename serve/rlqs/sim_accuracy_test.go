//go:build !race

// The simulator's accuracy runs are one goroutine's computation at scale: -race finds
// nothing in them and makes them ten times slower, so make test runs them in its first,
// race-free pass (their names contain "Sim"; the model they drive is in sim_test.go).

package rlqs

import (
	"fmt"
	"testing"
	"time"
)

// TestSimAccuracy runs simCases: the heavy client's admissions in every sliding window
// after the first stay within its row's bound (1.05 × the limit) and above a floor (a
// server that assigned nothing would pass the bound); the under-limit clients are denied
// no more than their row allows, where an exact sliding-window log denies none; light
// clients are never denied, streams cut every 7 s and buckets that start empty included;
// and no assignment expires at an Envoy (a healthy stream renews every one in time, and
// a cut one is started again within a report).
func TestSimAccuracy(t *testing.T) {
	base, cases := simCases()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := base
			tc.mod(&c)
			r := runSim(t, c)
			w := c.Window.Milliseconds()
			most, fewest := windowCounts(r.heavy, w, w, w*int64(1+c.Windows))
			t.Logf("FIGURE rlqs-sim %s: %s", tc.name, r.figure(c, most, fewest))
			if float64(most) > tc.most*float64(c.Limit) {
				t.Errorf("heavy client admitted %d in a window, above %.2f × %d", most, tc.most, c.Limit)
			}
			if float64(fewest) < tc.least*float64(c.Limit) {
				t.Errorf("heavy client admitted only %d in a window, below %.2f × %d", fewest, tc.least, c.Limit)
			}
			for i, bound := range []float64{tc.under1, tc.under2} {
				u := r.under[i]
				if u.exact > 0 {
					t.Errorf("under-limit client %d: the exact log denied %d: the load is not under the limit", i+1, u.exact)
				}
				if u.rate() > bound {
					t.Errorf("under-limit client %d denied %d of %d requests after the first window (%.2f%%), above %.2f%%", i+1, u.denied, u.reqs, 100*u.rate(), 100*bound)
				}
			}
			if r.lightDenied > tc.lights {
				t.Errorf("%d of %d light-client requests denied, want at most %d", r.lightDenied, r.lightReqs, tc.lights)
			}
			if r.expired > 0 {
				t.Errorf("%d assignments expired at the Envoys", r.expired)
			}
			if c.CutEvery > 0 && r.cuts == 0 {
				t.Error("no stream was cut")
			}
		})
	}
}

// figure is one run's line of figures.
func (r simResult) figure(c simConfig, most, fewest int) string {
	return fmt.Sprintf("%d×%d Envoys reporting every %v; heavy client at %.0f×: %d requests, admitted per %v window after the first max %d (%.3f× the limit %d), min %d (%.3f×); under-limit 0.8× at one Envoy: %d of %d denied after the first window (%.2f%%), %d of %d in all, exact log %d; 0.5× spread: %d of %d (%.2f%%), %d of %d in all, exact log %d; light clients: %d of %d denied; assignments expired %d; streams cut %d, reports lost %d; %d reports, %d responses",
		c.DCs, c.EnvoysPerDC, c.interval(), c.HeavyLoad, r.heavyReqs, c.Window, most, float64(most)/float64(c.Limit), c.Limit,
		fewest, float64(fewest)/float64(c.Limit),
		r.under[0].denied, r.under[0].reqs, 100*r.under[0].rate(), r.under[0].allDenied, r.under[0].allReqs, r.under[0].exact,
		r.under[1].denied, r.under[1].reqs, 100*r.under[1].rate(), r.under[1].allDenied, r.under[1].allReqs, r.under[1].exact,
		r.lightDenied, r.lightReqs, r.expired, r.cuts, r.dropped, r.reports, r.responses)
}

// TestSimUnderLimitCauses runs the smallest scenarios that showed why a client under its
// limit was denied at three data centers (docs/rlqs.md, "Why under-limit clients were
// denied"), each beside a control that differs in one thing, with one client and no
// other traffic. Both causes are fixed; the bounds hold what is met.
//
//   - A client at 0.5× spread over 60 Envoys of one data center, about a request a
//     second each, with no share between data centers at all: each holder's allotment is
//     a small token bucket that random arrivals overrun when it is too small. It was
//     (2.9% denied): the other holders' refill was kept back for a period beyond their
//     next reports, and a holder whose last period drew few requests had a small share.
//     Now each holder is given, while the key is under its limit, at least what the
//     holders' mean demand may plausibly ask for (0.3%). Over 20 Envoys none is denied.
//   - A client at 0.8× behind the one Envoy of one of three data centers was denied (6%)
//     while its data center's share of the room fell to about an even third at its
//     reports: the snapshot's demand decays with τ = 1 s and a report comes every 5 s, so
//     the share computed when a report arrives was that of a demand decayed for up to
//     5 s, which the prior spread over the other data centers outweighed. Now the
//     report's own rate stands for its site's demand when that is more (0.4%). At one
//     data center it is not denied.
func TestSimUnderLimitCauses(t *testing.T) {
	base, _ := simCases()
	base.HeavyLoad, base.Lights, base.Under1, base.Under2 = 0, 0, 0, 0
	for _, tc := range []struct {
		name       string
		dcs, envoy int
		under1     float64 // the load behind one Envoy (else spread)
		seed       uint64
		bound      float64 // the denied part after the first window, at most
	}{
		{"spread-1x20", 1, 20, 0, 1, 0.01},
		{"spread-1x60", 1, 60, 0, 1, 0.01},
		{"one-envoy-1x1", 1, 1, 0.8, 2, 0},
		{"one-envoy-3x1", 3, 1, 0.8, 2, 0.01},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := base
			c.DCs, c.EnvoysPerDC, c.Seed = tc.dcs, tc.envoy, tc.seed
			i := 1
			if tc.under1 > 0 {
				c.Under1, i = tc.under1, 0
			} else {
				c.Under2 = 0.5
			}
			r := runSim(t, c)
			u := r.under[i]
			t.Logf("FIGURE rlqs-sim-cause %s: %d of %d denied after the first window (%.2f%%), exact log %d", tc.name, u.denied, u.reqs, 100*u.rate(), u.exact)
			if u.reqs == 0 {
				t.Fatal("no request")
			}
			if u.exact > 0 {
				t.Errorf("the exact log denied %d: the load is not under the limit", u.exact)
			}
			if u.rate() > tc.bound {
				t.Errorf("denied %d of %d requests after the first window (%.2f%%), above %.2f%%", u.denied, u.reqs, 100*u.rate(), 100*tc.bound)
			}
		})
	}
}

// TestSimAccuracySeeds runs the rows of Envoy's cadence and deployment — 1 and 3 data
// centers × 20 Envoys, streams whole or cut every 7 s — over seeds 1–6: the heavy client
// within 1.05× the limit in every window after the first, the light clients never denied,
// no assignment expiring, and the under-limit clients denied no more than the worst of
// seeds 1–6 (a little above, against regressions): none at 1 × 20; at 3 × 20 the client
// spread over every Envoy 0.07–0.50%, and the client behind one Envoy up to 0.79% (1.00%
// with streams cut every 7 s, seed 5: 48 of 4 801, held to the 1% aimed at) (docs/rlqs.md,
// Accuracy).
func TestSimAccuracySeeds(t *testing.T) {
	base, _ := simCases()
	three := func(c *simConfig) { c.DCs = 3 }
	cut := func(c *simConfig) { c.CutEvery = 7 * time.Second }
	for _, tc := range []struct {
		name           string
		mod            func(*simConfig)
		under1, under2 float64
	}{
		{"1x20", func(*simConfig) {}, 0, 0},
		{"3x20", three, 0.0085, 0.006},
		{"1x20-cut-7s", cut, 0, 0},
		{"3x20-cut-7s", func(c *simConfig) { three(c); cut(c) }, 0.01, 0.006},
	} {
		for seed := uint64(1); seed <= 6; seed++ {
			c := base
			tc.mod(&c)
			c.Seed = seed
			r := runSim(t, c)
			w := c.Window.Milliseconds()
			most, _ := windowCounts(r.heavy, w, w, w*int64(1+c.Windows))
			t.Logf("FIGURE rlqs-sim-seed %s seed %d: heavy max %.3f×; 0.8× at one Envoy %.2f%% denied, 0.5× spread %.2f%%; light %d of %d denied; expired %d",
				tc.name, seed, float64(most)/float64(c.Limit), 100*r.under[0].rate(), 100*r.under[1].rate(), r.lightDenied, r.lightReqs, r.expired)
			if float64(most) > 1.05*float64(c.Limit) {
				t.Errorf("%s seed %d: heavy client admitted %d in a window, above 1.05 × %d", tc.name, seed, most, c.Limit)
			}
			for i, bound := range []float64{tc.under1, tc.under2} {
				if u := r.under[i]; u.rate() > bound || u.exact > 0 {
					t.Errorf("%s seed %d: under-limit client %d denied %d of %d (%.2f%%), above %.2f%% (exact log %d)", tc.name, seed, i+1, u.denied, u.reqs, 100*u.rate(), 100*bound, u.exact)
				}
			}
			if r.lightDenied > 0 || r.expired > 0 {
				t.Errorf("%s seed %d: %d light-client requests denied, %d assignments expired", tc.name, seed, r.lightDenied, r.expired)
			}
		}
	}
}
