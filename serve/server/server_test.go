package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamlimit/streamlimit"
	"github.com/streamlimit/streamlimit/internal/testenv"
	"github.com/streamlimit/streamlimit/serve/httplimit"
	"github.com/streamlimit/streamlimit/serve/server"
	"github.com/streamlimit/streamlimit/topics"
)

const rulesYAML = `
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 2, scope: local}
`

func writeRules(t testing.TB) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(p, []byte(rulesYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func check(t *testing.T, addr, user string) string {
	t.Helper()
	body := `{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"` + user + `"}]}]}`
	resp, err := http.Post("http://"+addr+"/v1/check", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		OverallCode string `json:"overall_code"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return out.OverallCode
}

func get(t *testing.T, u string) (int, string) {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestServerServesAndShutsDownCleanly runs a whole enforcer on the real broker: it answers
// the check API, publishes the admitted hits (flushed at shutdown), reports readiness and
// metrics, and leaves no goroutine behind.
func TestServerServesAndShutsDownCleanly(t *testing.T) {
	brokers := testenv.Brokers(t)
	hits := testenv.CreateTopic(t, "hits", 2, nil)
	counts := testenv.CreateTopic(t, "counts", 2, map[string]*string{"cleanup.policy": ptr("compact")})
	before := runtime.NumGoroutine()

	srv, err := server.New(server.Config{
		Config: streamlimit.Config{
			Site:        "eu",
			Rules:       writeRules(t),
			Brokers:     brokers,
			HitsTopic:   hits,
			CountsTopic: counts,
		},
		HTTPAddr: "127.0.0.1:0",
		GRPCAddr: "127.0.0.1:0",
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()

	base := "http://" + srv.HTTPAddr()
	waitFor(t, func() bool { code, _ := get(t, base+"/readyz"); return code == 200 })
	// No aggregator runs, so the snapshot is stale and the global limit of 3 is decided
	// on the default share (1): 3 admitted, then denied.
	var codes []string
	for range 5 {
		codes = append(codes, check(t, srv.HTTPAddr(), "42"))
	}
	if got := strings.Join(codes, ","); got != "OK,OK,OK,OVER_LIMIT,OVER_LIMIT" {
		t.Fatalf("decisions %s", got)
	}
	if code, body := get(t, base+"/healthz"); code != 200 || body != "ok\n" {
		t.Fatalf("healthz %d %q", code, body)
	}
	_, metrics := get(t, base+"/metrics")
	for _, m := range []string{"streamlimit_enforcer_decisions_total", "streamlimit_snapshot_age_seconds", "streamlimit_producer_hits_in_total", "streamlimit_enforcer_rules_reloads_total"} {
		if !strings.Contains(metrics, m) {
			t.Errorf("/metrics lacks %s", m)
		}
	}

	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	http.DefaultClient.CloseIdleConnections()
	waitForMsg(t, func() bool { return runtime.NumGoroutine() <= before }, func() string {
		buf := make([]byte, 1<<20)
		return fmt.Sprintf("goroutines: %d before, %d after:\n%s", before, runtime.NumGoroutine(), buf[:runtime.Stack(buf, true)])
	})
	// Shutdown flushed the producer: the 3 admitted hits are in the hits topic.
	if n := countHits(t, hits); n != 3 {
		t.Fatalf("hits topic holds %d hits, want 3", n)
	}
}

func countHits(t *testing.T, topic string) int64 {
	t.Helper()
	cl := testenv.KafkaClient(t, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var n int64
	for {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return n
		}
		fs.EachRecord(func(r *kgo.Record) {
			hs, err := topics.DecodeHits(r.Value)
			if err != nil {
				t.Fatalf("bad hit: %v", err)
			}
			for _, h := range hs {
				n += h.Count
			}
		})
	}
}

// TestReverseProxy puts the enforcer in front of an upstream: the 429 never reaches it.
func TestReverseProxy(t *testing.T) {
	var upstreamHits atomic.Int64
	up := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		upstreamHits.Add(1)
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("X-Echo", r.Method+" "+r.URL.RequestURI())
		_, _ = w.Write(b)
	})}
	upLn := listen(t)
	go func() { _ = up.Serve(upLn) }()
	t.Cleanup(func() { _ = up.Close() })
	upstream, _ := url.Parse("http://" + upLn.Addr().String())

	srv, err := server.New(server.Config{
		Config:    streamlimit.Config{Site: "eu", Rules: writeRules(t)},
		HTTPAddr:  "127.0.0.1:0",
		GRPCAddr:  "off",
		Upstream:  upstream,
		ProxyAddr: "127.0.0.1:0",
		HTTP:      httplimit.Config{Domain: "api", Descriptors: []httplimit.Descriptor{{Entries: []httplimit.Source{{Type: "remote_address"}}}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	defer func() { cancel(); <-done }()

	var statuses []int
	for i := range 3 {
		resp, err := http.Post("http://"+srv.ProxyAddr()+"/echo?i=1", "text/plain", bytes.NewReader([]byte("body")))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		statuses = append(statuses, resp.StatusCode)
		if i < 2 && (string(b) != "body" || resp.Header.Get("X-Echo") != "POST /echo?i=1") {
			t.Fatalf("request %d arrived changed: %q %q", i, b, resp.Header.Get("X-Echo"))
		}
		if i == 2 && resp.Header.Get("Retry-After") == "" {
			t.Fatalf("429 without Retry-After")
		}
	}
	if statuses[0] != 200 || statuses[1] != 200 || statuses[2] != http.StatusTooManyRequests {
		t.Fatalf("statuses %v", statuses)
	}
	if n := upstreamHits.Load(); n != 2 {
		t.Fatalf("upstream saw %d requests, want 2 (the 429 must not reach it)", n)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	waitForMsg(t, cond, func() string { return "" })
}

func waitForMsg(t *testing.T, cond func() bool, msg func() string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within 30s %s", msg())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func ptr(s string) *string { return &s }
