// Package aggregator turns the hits topics of every data center into absolute
// sliding-window counts per counter key, with a per-site breakdown, on the compacted
// counts topic.
//
// An Aggregator is one member of a Kafka consumer group over the local hits topic and its
// MirrorMaker-2 copies ("hits", "us.hits", ..., by list or pattern). New makes one from a
// Config (every zero field has a default); Run consumes, counts and publishes until its context ends, then leaves the
// group; Ready says whether no assigned partition is replaying (for /readyz):
//
//	agg, err := aggregator.New(aggregator.Config{Brokers: []string{"localhost:9092"}})
//	go agg.Run(ctx)
//
// How keys are owned (the group's balancer, BalancerProtocol), recovery by replay,
// emission, heartbeats, bad input and the limits are in docs/aggregator.md.
package aggregator
