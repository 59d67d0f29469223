package aggregator

import (
	"testing"
	"testing/synctest"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamlimit/streamlimit/internal/testenv"
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

// onKfake runs test (subtest "kfake") on a kfake cluster of its own in a synctest bubble:
// time is virtual and advances only when every goroutine of the test waits, so every wait
// ends when the aggregator has done what it would do and the verdict does not depend on
// the machine's load. test must not call t.Parallel, and every goroutine it starts must
// end before it returns or in a Cleanup.
func onKfake(t *testing.T, test func(*testing.T, *env)) {
	t.Run("kfake", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) { test(t, newVirtualEnv(t)) })
	})
}

// onKafkas runs test on kfake as onKfake does, and then on the real broker (subtest
// "kafka"): for a test whose contract rests on what kfake only imitates (the broker's
// offsets, its listings by time, its group protocol) and is worth the real broker's cost.
// The real broker's run is left out under -short.
func onKafkas(t *testing.T, test func(*testing.T, *env)) {
	onKfake(t, test)
	t.Run("kafka", func(t *testing.T) {
		testenv.RealParts(t) // the kfake run covers the logic in the unit tier
		test(t, newEnv(t))
	})
}
