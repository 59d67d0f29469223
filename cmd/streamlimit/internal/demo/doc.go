// Package demo runs streamlimit end to end in one process, on an embedded Kafka-protocol
// broker, and measures whether a global limit holds: the engine of `streamlimit demo`.
//
// Run starts franz-go's kfake broker (with log compaction running), creates the hits and
// counts topics with topicadmin.Ensure, runs one aggregator and one enforcer per site
// ("eu", "us", "ap", …), each enforcer with its own snapshot of the counts topic, its own
// producer of hits and its own exact site counter, all sharing the rules in rules.yaml
// (one global limit on the client descriptor). It then drives synthetic clients against
// the enforcers with the real clock, calling enforcer.Engine.Decide directly:
//
//   - light clients, each well under the limit and always on its home site;
//   - one abusive client sending five times its limit, spread evenly over all sites, so that
//     each site alone sees less than the limit and only a global count can stop it;
//   - one burst, at one site, of three times the limit within a second.
//
// Every decision is recorded with its time and site. The Summary reports admissions per
// site and per client and, for the abusive client, the exact maximum and mean of its
// admissions over every sliding window of the limit's length, against the limit and against
// what independent per-site limiters would have admitted (the limit times the number of
// sites).
package demo
