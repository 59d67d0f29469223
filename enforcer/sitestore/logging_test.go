package sitestore

import (
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/streamlimit/streamlimit/enforcer/algo"
	"github.com/streamlimit/streamlimit/internal/testenv"
)

// syncBuffer is a log or output read while it is written.
type syncBuffer = testenv.SyncBuffer

// TestGoRedisLogsThroughSlog: go-redis's own lines (here, its pool failing to dial) come
// out of the slog handler installed with GoRedisLogger, as JSON.
func TestGoRedisLogsThroughSlog(t *testing.T) {
	var buf syncBuffer
	redis.SetLogger(GoRedisLogger{Logger: slog.New(slog.NewJSONHandler(&buf, nil))})
	t.Cleanup(func() { redis.SetLogger(GoRedisLogger{}) })
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close() // nothing listens there now
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	defer c.Close()
	for range 8 {
		_ = c.Ping(context.Background()).Err()
	}
	var line map[string]any
	for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		if err := json.Unmarshal([]byte(l), &line); err != nil {
			t.Fatalf("not a JSON log line: %q (%v)", l, err)
		}
		if line["msg"] == "redis client" && strings.Contains(line["detail"].(string), "dial") {
			return
		}
	}
	t.Fatalf("no go-redis dial failure in the slog output: %q", buf.String())
}

// TestAuthFailureLoggedOnce: a Store with a wrong password logs one error line with
// Redis's reason, however many calls fail on it, and decides in process meanwhile.
func TestAuthFailureLoggedOnce(t *testing.T) {
	rd := startPrivateRedis(t, "--requirepass", "right")
	var buf syncBuffer
	s := newStore(t, nil, "sl:", func(c *Config) {
		c.Addrs, c.Password = []string{rd.Addr()}, "wrong"
		c.Logger = slog.New(slog.NewJSONHandler(&buf, nil))
	})
	op := algo.Op{Key: "d|auth#1m", Algorithm: algo.FixedWindow, Limit: algo.Limit{Requests: 100, Window: time.Minute}, N: 1}
	out := make([]algo.Decision, 1)
	for i := range 5 {
		if _, fb := s.AllowAll(context.Background(), t0, []algo.Op{op}, out); !fb {
			t.Fatalf("call %d with a wrong password was decided in Redis", i)
		}
	}
	var n int
	for _, l := range strings.Split(buf.String(), "\n") {
		if strings.Contains(l, "refused this enforcer's credentials") {
			n++
			if !strings.Contains(l, "WRONGPASS") && !strings.Contains(l, "invalid") {
				t.Fatalf("the auth failure line does not carry Redis's reason: %s", l)
			}
		}
	}
	if n != 1 {
		t.Fatalf("auth failure logged %d times over 5 failing calls, want once:\n%s", n, buf.String())
	}
}
