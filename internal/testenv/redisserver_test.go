package testenv

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
)

// TestRedisServerRetriesAndRestarts: a start that redis-server refuses is retried (the
// way a port taken by something else is), and a killed server restarts on its port, empty.
func TestRedisServerRetriesAndRestarts(t *testing.T) {
	starts := 0
	r := StartRedisServer(t, RedisServerOptions{Args: func(int, string) []string {
		starts++
		if starts == 1 {
			return []string{"--no-such-directive", "x"}
		}
		return nil
	}})
	if starts != 2 {
		t.Fatalf("redis-server started after %d attempts, want 2 (the first one refused)", starts)
	}
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: r.Addr()})
	defer c.Close()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	port := r.Port()
	r.Kill()
	if pingReady(r.Addr()) {
		t.Fatal("the killed server still answers")
	}
	r.Restart()
	if r.Port() != port {
		t.Fatalf("restarted on port %d, want %d", r.Port(), port)
	}
	if n, err := c.Exists(ctx, "k").Result(); err != nil || n != 0 {
		t.Fatalf("after a restart: EXISTS k = %d, %v; want 0 (a crash loses the data)", n, err)
	}
}
