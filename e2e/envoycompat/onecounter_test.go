package envoycompat

import (
	"context"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/streamlimit/streamlimit"
	"github.com/streamlimit/streamlimit/enforcer"
	"github.com/streamlimit/streamlimit/enforcer/sitestore"
	"github.com/streamlimit/streamlimit/internal/testenv"
	"github.com/streamlimit/streamlimit/serve/httplimit"
	"github.com/streamlimit/streamlimit/serve/server"
)

// TestOneCounterEveryAPI: in a compat: envoy domain, a limit that envoyproxy/ratelimit
// would count is counted at its one key in envoyproxy/ratelimit's layout whichever way a
// client asks — the gRPC service, the HTTP check API, /v1/auth — so that a client that
// spends a third of its limit through each is refused by each after that, on real Redis,
// and the key holds every request, the refused ones too, as there.
func TestOneCounterEveryAPI(t *testing.T) {
	const limit = 12
	redisAddr := testenv.Redis(t)
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	t.Cleanup(func() { rdb.Close() })
	dir := t.TempDir()
	file := "domain: every\ncompat: envoy\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: " + strconv.Itoa(limit) + "}\n"
	if err := os.WriteFile(filepath.Join(dir, "every.yaml"), []byte(file), 0o644); err != nil {
		t.Fatal(err)
	}
	prefix := "every-" + randomHex(6) + ":"
	srv, err := server.New(server.Config{
		Config: streamlimit.Config{
			Site:   "compat",
			Rules:  dir,
			Redis:  sitestore.Redis{Addrs: []string{redisAddr}, KeyPrefix: prefix, Timeout: theirRedisTimeout},
			Tuning: enforcer.Tuning{EnvoyKeyPrefix: prefix},
			Logger: slog.New(slog.DiscardHandler),
		},
		HTTPAddr: "127.0.0.1:0",
		GRPCAddr: "127.0.0.1:0",
		HTTP: httplimit.Config{Domain: "every", Descriptors: []httplimit.Descriptor{{Entries: []httplimit.Source{
			{Type: httplimit.SourceHeader, Name: "X-User", Key: "user"}}}}},
		Registry: prometheus.NewRegistry(),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	// The window: a day, whose end the test keeps away from.
	if now := time.Now(); now.Truncate(24*time.Hour).Add(24*time.Hour).Sub(now) < time.Minute {
		time.Sleep(time.Minute)
	}
	day := time.Now().Unix() / 86400 * 86400
	key := prefix + "every_user_u1_" + strconv.FormatInt(day, 10)

	grpcClient := dial(t, srv.GRPCAddr())
	viaGRPC := func() bool {
		resp, err := grpcClient.ShouldRateLimit(ctx, req("every", 0, d("user", "u1")))
		if err != nil {
			t.Fatal(err)
		}
		return resp.OverallCode == rlsv3.RateLimitResponse_OK
	}
	viaCheck := func() bool {
		resp, err := http.Post("http://"+srv.HTTPAddr()+"/v1/check", "application/json",
			strings.NewReader(`{"domain":"every","descriptors":[{"entries":[{"key":"user","value":"u1"}]}]}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}
	viaAuth := func() bool {
		r, err := http.NewRequest(http.MethodGet, "http://"+srv.HTTPAddr()+"/v1/auth", nil)
		if err != nil {
			t.Fatal(err)
		}
		r.Header.Set("X-User", "u1")
		resp, err := http.DefaultClient.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNoContent && resp.StatusCode != httplimit.DefaultDeniedStatus {
			t.Fatalf("/v1/auth: %s", resp.Status)
		}
		return resp.StatusCode == http.StatusNoContent
	}
	apis := []struct {
		name string
		ask  func() bool
	}{{"gRPC", viaGRPC}, {"/v1/check", viaCheck}, {"/v1/auth", viaAuth}}
	for _, api := range apis {
		for i := range limit / len(apis) {
			if !api.ask() {
				t.Fatalf("request %d of %d through %s refused", i+1, limit/len(apis), api.name)
			}
		}
	}
	for _, api := range apis {
		if api.ask() {
			t.Errorf("after %d requests of a limit of %d through three APIs, %s admitted another", limit, limit, api.name)
		}
	}
	if v, err := rdb.Get(ctx, key).Int64(); err != nil || v != limit+int64(len(apis)) {
		t.Errorf("GET %s: %d, %v; want %d: every request, the refused ones too", key, v, err, limit+len(apis))
	}
	// Nothing of this limit in streamlimit's own layout.
	if keys, err := rdb.Keys(ctx, prefix+"{every}*").Result(); err != nil || len(keys) != 0 {
		t.Errorf("keys in streamlimit's layout: %v, %v; want none", keys, err)
	}
}
