// Package sim is the accuracy simulator behind `streamlimit sim`: it runs the real
// enforcer (one enforcer.Engine per site, each with its own in-memory snapshot and
// in-process site counter) and the real aggregator counting (aggregator.Memory) on a
// virtual clock advanced in 1 ms steps, joined by an in-memory transport with a
// configurable pipeline lag, and measures the decisions against an exact global
// sliding-window log.
//
// # Model
//
// Every millisecond, in this order: each site's producer model releases the (key, 100 ms
// bucket) counts whose bucket has ended, at the 50 ms flush period of producer.Producer;
// the aggregator counts the hits whose transport delay (Lag/2) has passed; every
// EmitInterval it emits counts and a heartbeat, which reach every site's snapshot after
// the rest of Lag; then the requests of that millisecond are decided, in arrival order.
// Traffic comes from math/rand/v2's PCG with a seed derived from Config.Seed and the
// traffic parameters, so a run is a pure function of its Config.
//
// # Measures
//
// Result documents each statistic. In short: the number of admitted requests in the
// sliding window (t−W, t] over all sites, divided by the limit (max and mean); admitted
// requests against an exact global log run separately on the same requests (Oracle); and,
// decision by decision, whether streamlimit admitted a request although its own admitted
// history already held the limit in (t−W, t] (wrongly allowed), or denied one although it
// held less (wrongly denied).
//
// Compare runs the comparison of counting methods on one local limiter.
package sim
