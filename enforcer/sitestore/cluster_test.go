package sitestore

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/streamlimit/streamlimit/enforcer/algo"
	"github.com/streamlimit/streamlimit/enforcer/sitecount"
	"github.com/streamlimit/streamlimit/internal/testenv"
)

// startCluster starts a 3-master Redis Cluster on loopback and returns its addresses.
func startCluster(t *testing.T) []string {
	t.Helper()
	testenv.RealParts(t)
	if _, err := exec.LookPath("redis-cli"); err != nil {
		startPrivateRedis(t) // fails or skips the standard way when redis-server is missing
		t.Fatalf("redis-cli is not installed: %v", err)
	}
	var addrs []string
	for range 3 {
		// The bus port is chosen too: by default it is the port plus 10 000, which nothing
		// reserved and which is out of range for ports over 55 535. Probed, as redis-server
		// binds it: StartRedisServer calls Args again for each start it retries.
		n := testenv.StartRedisServer(t, testenv.RedisServerOptions{Args: func(_ int, dir string) []string {
			return []string{"--cluster-enabled", "yes", "--cluster-config-file", dir + "/nodes.conf",
				"--cluster-port", strconv.Itoa(testenv.FreePort(t))}
		}})
		addrs = append(addrs, n.Addr())
	}
	out, err := exec.Command("redis-cli", append(append([]string{"--cluster", "create"}, addrs...), "--cluster-replicas", "0", "--cluster-yes")...).CombinedOutput()
	if err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	// Every master, not only the first: each learns the cluster is whole on its own, and
	// one that still says CLUSTERDOWN would send its keys' requests to the fallback.
	deadline := time.Now().Add(15 * time.Second)
	for _, a := range addrs {
		c := redis.NewClient(&redis.Options{Addr: a})
		for {
			info, _ := c.ClusterInfo(context.Background()).Result()
			if strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				c.Close()
				t.Fatalf("cluster not ok at %s: %s", a, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
		c.Close()
	}
	return addrs
}

// TestCluster: on a real 3-master cluster, a Store and a Counter built from the three
// addresses decide in Redis: counters of many domains land on all three masters (one hash
// slot per domain), a request over two domains is decided per domain, one with global and
// site limits of one domain in one call, and none falls back.
func TestCluster(t *testing.T) {
	addrs := startCluster(t)
	s := newStore(t, nil, "sl:", func(c *Config) { c.Addrs = addrs })
	c := NewCounter(s, CounterOptions{})
	ctx := context.Background()
	out := make([]algo.Decision, 2)
	lim := algo.Limit{Requests: 2, Window: time.Minute}
	for d := range 12 {
		ops := []algo.Op{
			{Key: fmt.Sprintf("d%d|u=1#1m", d), Algorithm: algo.SlidingWindow, Limit: lim, N: 1},
			{Key: fmt.Sprintf("e%d|u=1#1m", d), Algorithm: algo.TokenBucket, Limit: lim, N: 1},
		}
		for i := range 3 {
			ok, fb := s.AllowAll(ctx, t0, ops, out)
			if fb || ok != (i < 2) {
				t.Fatalf("domains d%d/e%d, request %d: allowed %v fellBack %v", d, d, i, ok, fb)
			}
		}
		gop := []sitecount.Op{{Key: fmt.Sprintf("g%d|u=1#1m", d), Window: time.Minute, N: 1, Cap: 1}}
		if ok, fb, _ := c.CommitReport(ctx, t0, gop, nil); !ok || fb {
			t.Fatalf("site count on the cluster: %v, fell back %v", ok, fb)
		}
		if ok, fb, _ := c.CommitReport(ctx, t0, gop, nil); ok || fb {
			t.Fatalf("site count on the cluster passed its cap: %v, fell back %v", ok, fb)
		}
	}
	// A request's global and site limits of one domain (one hash slot) are decided in one
	// call; of two domains, apart.
	sop := []algo.Op{{Key: "j|t=1#1m", Algorithm: algo.SlidingWindow, Limit: lim, N: 1}}
	counts := make([]float64, 1)
	gop := []sitecount.Op{{Key: "j|u=1#1m", Window: time.Minute, N: 1, Cap: 10}}
	if j := c.CommitWithSite(ctx, t0, s, gop, counts, sop, out); !j.Done || !j.Taken || j.GlobalFellBack || j.SiteFellBack {
		t.Fatalf("global and site limits of one domain on the cluster: %+v, want taken in Redis", j)
	}
	gop[0].Key = "k|u=1#1m"
	if j := c.CommitWithSite(ctx, t0, s, gop, counts, sop, out); j.Done {
		t.Fatalf("global and site limits of two domains on the cluster: %+v, want left to the calls apart", j)
	}
	// The keys are spread over the masters.
	used := 0
	for _, a := range addrs {
		n := redis.NewClient(&redis.Options{Addr: a})
		if k, _ := n.DBSize(ctx).Result(); k > 0 {
			used++
		}
		_ = n.Close()
	}
	if used != 3 {
		t.Fatalf("counters of 36 domains landed on %d of 3 masters", used)
	}
}
