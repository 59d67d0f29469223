// Package sim is the accuracy simulator behind `streamlimit sim`: it runs the real
// enforcer (one enforcer.Engine per site) and the real aggregator counting
// (aggregator.Memory) on a virtual clock advanced in 1 ms steps, joined by an in-memory
// transport with a configurable pipeline lag, and measures the decisions against an exact
// global sliding-window log. Run runs one Config into a Result; RunMatrix, RunDC,
// RunDCScenarios, RunTiers, RunWAN and Compare run the other tables. What it measures,
// with the figures: docs/accuracy.md.
package sim
