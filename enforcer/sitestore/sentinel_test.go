package sitestore

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/streamlimit/streamlimit/enforcer/algo"
	"github.com/streamlimit/streamlimit/internal/testenv"
)

func freePort(t *testing.T) int { return testenv.FreePort(t) }

// startRedis runs redis-server with args and waits until addr answers PING.
func startRedis(t *testing.T, addr string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("redis-server", args...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	for deadline := time.Now().Add(10 * time.Second); c.Ping(context.Background()).Err() != nil; {
		if time.Now().After(deadline) {
			t.Fatalf("redis-server %v did not come up", args)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return cmd
}

// TestSentinelFailover: a Store given a Sentinel's address and the master's name decides
// in the master, and after the master dies and the Sentinel promotes its replica, in the
// new master, with the count the replica had copied.
func TestSentinelFailover(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		startPrivateRedis(t) // fails or skips the standard way
	}
	mp, rp, sp := freePort(t), freePort(t), freePort(t)
	maddr, raddr := "127.0.0.1:"+strconv.Itoa(mp), "127.0.0.1:"+strconv.Itoa(rp)
	base := []string{"--bind", "127.0.0.1", "--save", "", "--appendonly", "no"}
	master := startRedis(t, maddr, append([]string{"--port", strconv.Itoa(mp), "--dir", t.TempDir()}, base...)...)
	startRedis(t, raddr, append([]string{"--port", strconv.Itoa(rp), "--dir", t.TempDir(), "--replicaof", "127.0.0.1", strconv.Itoa(mp)}, base...)...)
	dir := t.TempDir()
	conf := filepath.Join(dir, "sentinel.conf")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\n"+
		"sentinel monitor site 127.0.0.1 %d 1\nsentinel down-after-milliseconds site 300\nsentinel failover-timeout site 2000\n",
		sp, dir, mp)), 0o600); err != nil {
		t.Fatal(err)
	}
	startRedis(t, "127.0.0.1:"+strconv.Itoa(sp), conf, "--sentinel")

	s := newStore(t, nil, "sl:", func(c *Config) {
		c.Addrs, c.MasterName = []string{"127.0.0.1:" + strconv.Itoa(sp)}, "site"
	})
	ctx := context.Background()
	op := algo.Op{Key: "d|sentinel#1m", Algorithm: algo.FixedWindow, Limit: algo.Limit{Requests: 3, Window: time.Minute}, N: 1}
	out := make([]algo.Decision, 1)
	if ok, fb := s.AllowAll(ctx, t0, []algo.Op{op}, out); !ok || fb {
		t.Fatalf("through the Sentinel: allowed %v fellBack %v", ok, fb)
	}
	// Let the replica copy the count, then kill the master. Its first synchronisation (a
	// full copy) can take seconds on a loaded machine.
	r := redis.NewClient(&redis.Options{Addr: raddr})
	defer r.Close()
	for deadline := time.Now().Add(30 * time.Second); r.Exists(ctx, "sl:{d}d|sentinel#1m", s.aliveKey).Val() != 2; {
		if time.Now().After(deadline) {
			t.Fatal("the replica did not copy the count")
		}
		time.Sleep(20 * time.Millisecond)
	}
	_ = master.Process.Kill()
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
