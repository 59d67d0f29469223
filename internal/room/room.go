// Package room is the rule by which sites that see each other a pipeline lag late share
// the room a window leaves under a limit: what one site keeps back for the others.
//
// A site sees the others' admissions only once their hits have crossed the pipeline, and
// they see its admissions as late. Keeping their total at the limit means keeping back,
// out of the room a site sees, what the others may admit before either side's hits reach
// the other. Dividing the room into shares keeps back far more than that when the shares
// follow demand a lag late: a client near its limit is refused at one site while room it
// will not use is kept for another. Reserving what the others can plausibly admit within
// the lag — their recent request rate over the lag and a margin, never more than their
// shares — keeps back only what is at risk: a site that has not served a key is kept
// almost nothing of it, and a client that moves brings its rate with it a lag later.
//
// The enforcer's global decision keeps back this much for the other sites of a key
// (package enforcer, "Global limits"); the Rate Limit Quota Service's allotment to its
// token-bucket holders keeps back the same expected spend of the other holders.
package room

import "math"

// Expected returns what sites requesting at rate (requests per unit of time, summed over
// them) may admit over horizon (the same unit) with z standard deviations of margin, taking
// the count of their requests over the horizon to be Poisson: rate×horizon + z×√(rate×horizon).
// A rate or horizon at or below zero gives 0.
func Expected(rate, horizon, z float64) float64 {
	n := rate * horizon
	if n <= 0 {
		return 0
	}
	return n + max(z, 0)*math.Sqrt(n)
}
