package sitestore

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/streamlimit/streamlimit/enforcer/algo"
	"github.com/streamlimit/streamlimit/internal/testenv"
)

// TestSentinelFailover: a Store given a Sentinel's address and the master's name decides
// in the master, and after the master dies and the Sentinel promotes its replica, in the
// new master, with the count the replica had copied.
func TestSentinelFailover(t *testing.T) {
	master := testenv.StartRedisServer(t, testenv.RedisServerOptions{})
	replica := testenv.StartRedisServer(t, testenv.RedisServerOptions{Args: func(int, string) []string {
		return []string{"--replicaof", "127.0.0.1", strconv.Itoa(master.Port())}
	}})
	conf := filepath.Join(t.TempDir(), "sentinel.conf")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf("sentinel monitor site 127.0.0.1 %d 1\n"+
		"sentinel down-after-milliseconds site 300\nsentinel failover-timeout site 2000\n", master.Port())), 0o600); err != nil {
		t.Fatal(err)
	}
	sentinel := testenv.StartRedisServer(t, testenv.RedisServerOptions{Config: conf,
		Args: func(int, string) []string { return []string{"--sentinel"} }})

	s := newStore(t, nil, "sl:", func(c *Config) {
		c.Addrs, c.MasterName = []string{sentinel.Addr()}, "site"
	})
	ctx := context.Background()
	op := algo.Op{Key: "d|sentinel#1m", Algorithm: algo.FixedWindow, Limit: algo.Limit{Requests: 3, Window: time.Minute}, N: 1}
	out := make([]algo.Decision, 1)
	if ok, fb := s.AllowAll(ctx, t0, []algo.Op{op}, out); !ok || fb {
		t.Fatalf("through the Sentinel: allowed %v fellBack %v", ok, fb)
	}
	// Let the replica copy the count, then kill the master. Its first synchronisation (a
	// full copy) can take seconds on a loaded machine.
	r := redis.NewClient(&redis.Options{Addr: replica.Addr()})
	defer r.Close()
	for deadline := time.Now().Add(30 * time.Second); r.Exists(ctx, "sl:{d}d|sentinel#1m", s.aliveKey).Val() != 2; {
		if time.Now().After(deadline) {
			t.Fatal("the replica did not copy the count")
		}
		time.Sleep(20 * time.Millisecond)
	}
	master.Kill()
	// Until the Sentinel promotes the replica, requests fall back (from the last known
	// count); then Redis decides again, on the replica's copy plus what was admitted in
	// process meanwhile. Over it all, the limit holds.
	admitted := 1
	deadline := time.Now().Add(20 * time.Second)
	for {
		ok, fb := s.AllowAll(ctx, t0, []algo.Op{op}, out)
		if ok {
			admitted++
		}
		if !fb {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no decision in Redis 20 s after the master died")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if role, _ := r.Do(ctx, "ROLE").Slice(); len(role) == 0 || role[0] != "master" {
		t.Fatalf("the replica is not the master after the failover: %v", role)
	}
	for range 3 {
		ok, fb := s.AllowAll(ctx, t0, []algo.Op{op}, out)
		if fb {
			t.Fatal("fell back after the failover")
		}
		if ok {
			admitted++
		}
	}
	if admitted != 3 {
		t.Fatalf("%d admitted across the failover against a limit of 3", admitted)
	}
}
