// Package producer publishes hits to streamlimit's Kafka hits topic without ever slowing
// the request that records them: hits are counted in memory per counter and time bucket,
// and a background flush sends one record per counter and bucket.
//
// New builds a Producer from a Config and starts the flush; Hit and HitAt record hits
// (no I/O, never failing); Bulk returns a publisher for usage reported in bulk; Flush
// sends everything now; Close stops it, reporting what it could not deliver as an
// *UndeliveredError:
//
//	p, err := producer.New(producer.Config{Brokers: []string{"localhost:9092"}, Site: "eu-1"})
//	p.Hit("api|user=42#60s", time.Minute, 1)
//	defer p.Close(ctx)
//
// A Producer is safe for simultaneous use by multiple goroutines. Its model, its
// behaviour when Kafka is slow or down, partitioning and metrics: docs/producer.md.
package producer
