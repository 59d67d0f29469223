package server_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamlimit/streamlimit"
	"github.com/streamlimit/streamlimit/serve/server"
)

// An enforcer that cannot bind one of its ports fails to start without a word to Kafka: it
// had started its producer first, whose heartbeats and, at the close that followed the
// failure, leave records made every other site count it as a site that had joined and
// left. Each listener is tried with the others free.
func TestFailedStartPublishesNothing(t *testing.T) {
	for _, which := range []string{"http", "grpc", "rlqs"} {
		t.Run(which, func(t *testing.T) {
			cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "hits", "counts"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(cluster.Close)
			taken, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = taken.Close() })
			cfg := server.Config{
				Config: streamlimit.Config{
					Site:        "eu",
					Rules:       writeRules(t),
					Brokers:     cluster.ListenAddrs(),
					HitsTopic:   "hits",
					CountsTopic: "counts",
				},
				HTTPAddr: "127.0.0.1:0",
				GRPCAddr: "127.0.0.1:0",
				RLQSAddr: "127.0.0.1:0",
			}
			switch which {
			case "http":
				cfg.HTTPAddr = taken.Addr().String()
			case "grpc":
				cfg.GRPCAddr = taken.Addr().String()
			case "rlqs":
				cfg.RLQSAddr = taken.Addr().String()
			}
			if _, err = server.New(cfg); err == nil {
				t.Fatal("started on a port in use")
			}
			if !strings.Contains(err.Error(), which+" listener") {
				t.Errorf("error %q does not name the %s listener", err, which)
			}
			cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumeTopics("hits"),
				kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			defer cancel()
			fs := cl.PollFetches(ctx)
			if n := fs.NumRecords(); n > 0 {
				t.Errorf("a failed start wrote %d records to the hits topic, e.g. key %q", n, fs.Records()[0].Key)
			}
		})
	}
}
