package aggregator

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// virtualKafka starts a kfake cluster of one broker on kfake's in-memory network, for a
// test that runs in a synctest bubble: the clients' and the cluster's timers are on the
// bubble's virtual clock, and every wait ends when the code under test has done what it
// would do, whatever the machine's load. partitions gives each topic to create its count.
// It returns the seed brokers and the dialer option every client of the cluster needs.
func virtualKafka(t *testing.T, partitions map[string]int32) ([]string, kgo.Opt) {
	t.Helper()
	var network kfake.VirtualNetwork
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(9092), kfake.ListenFn(network.Listen))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	for name, n := range partitions {
		if err := cluster.CreateTopic(name, n, nil); err != nil {
			t.Fatalf("kfake: create %s: %v", name, err)
		}
	}
	return cluster.ListenAddrs(), kgo.Dialer(network.DialContext)
}
