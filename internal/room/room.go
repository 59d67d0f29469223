// Package room is the rule by which sites that see each other a pipeline lag late share
// the room a window leaves under a limit: what one site keeps back for the others — their
// recent request rate over the lag and a margin, never more than their shares. The
// enforcer's global decision and the Rate Limit Quota Service's allotment to its
// token-bucket holders both keep back this much; the rule and why: docs/decisions.md,
// "Global limits".
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
