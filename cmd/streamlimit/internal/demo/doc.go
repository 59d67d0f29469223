// Package demo runs streamlimit end to end in one process, on an embedded Kafka-protocol
// broker, and measures whether a global limit holds: the engine of `streamlimit demo`.
// Run starts the pipeline (kfake, the topics, one aggregator, one enforcer per site),
// drives synthetic clients against the enforcers and returns a Summary: admissions per
// site and client, and the abusive client's exact admissions per sliding window against
// the limit. What it shows: README.md, "What the demo shows".
package demo
