package server_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/streamlimit/streamlimit"
	"github.com/streamlimit/streamlimit/internal/testenv"
	"github.com/streamlimit/streamlimit/serve/httplimit"
	"github.com/streamlimit/streamlimit/serve/server"
)

// TestDelayInsteadOf429 runs an enforcer on the real broker with a global limit of 2 per
// second: its reverse proxy (ProxyMaxDelay) holds the third request of a second and
// forwards it, the nginx endpoint (AuthMaxDelay) holds it and then admits it, the check
// API does the same for a request with max_delay_ms and says how long it waited, and
// every admitted request is published once.
func TestDelayInsteadOf429(t *testing.T) {
	brokers := testenv.Brokers(t)
	hits := testenv.CreateTopic(t, "hits", 2, nil)
	counts := testenv.CreateTopic(t, "counts", 2, map[string]*string{"cleanup.policy": ptr("compact")})
	rulesPath := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(rulesPath, []byte("domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 2}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var upstreamHits atomic.Int64
	up := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { upstreamHits.Add(1) })}
	upLn := listen(t)
	go func() { _ = up.Serve(upLn) }()
	t.Cleanup(func() { _ = up.Close() })
	upstream, _ := url.Parse("http://" + upLn.Addr().String())

	srv, err := server.New(server.Config{
		Config: streamlimit.Config{
			Site:        "eu",
			Rules:       rulesPath,
			Brokers:     brokers,
			HitsTopic:   hits,
			CountsTopic: counts,
		},
		HTTPAddr:      "127.0.0.1:0",
		GRPCAddr:      "off",
		Upstream:      upstream,
		ProxyAddr:     "127.0.0.1:0",
		ProxyMaxDelay: httplimit.MaxDelay,
		AuthMaxDelay:  httplimit.MaxDelay,
		HTTP:          httplimit.Config{Domain: "api", Descriptors: []httplimit.Descriptor{{Entries: []httplimit.Source{{Type: "header", Name: "X-User", Key: "user"}}}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	defer func() {
		if cancel != nil {
			cancel()
			<-done
		}
	}()
	base := "http://" + srv.HTTPAddr()
	waitFor(t, func() bool { code, _ := get(t, base+"/readyz"); return code == 200 })

	var statuses []int
	for range 3 {
		req, _ := http.NewRequest("GET", "http://"+srv.ProxyAddr()+"/", nil)
		req.Header.Set("X-User", "7")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		statuses = append(statuses, resp.StatusCode)
	}
	if statuses[2] != 200 || upstreamHits.Load() != 3 {
		t.Fatalf("proxy statuses %v, upstream saw %d; want the third held and forwarded", statuses, upstreamHits.Load())
	}

	var authCodes []int
	for range 3 {
		req, _ := http.NewRequest("GET", base+"/v1/auth", nil)
		req.Header.Set("X-User", "9")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		authCodes = append(authCodes, resp.StatusCode)
	}
	if authCodes[2] != http.StatusNoContent {
		t.Fatalf("auth statuses %v; want the third held and admitted", authCodes)
	}

	var answers []string
	for _, maxDelay := range []string{"", "", `,"max_delay_ms":60000`} {
		body := `{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"8"}]}]` + maxDelay + `}`
		resp, err := http.Post(base+"/v1/check", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		var out struct {
			OverallCode string `json:"overall_code"`
			WaitedMs    int64  `json:"waited_ms"`
		}
		err = json.NewDecoder(resp.Body).Decode(&out)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		a := out.OverallCode
		if out.WaitedMs > 0 {
			a += " after waiting"
		}
		answers = append(answers, a)
	}
	if got := strings.Join(answers, ", "); got != "OK, OK, OK after waiting" {
		t.Fatalf("check API answers: %s", got)
	}
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if want := `streamlimit_enforcer_waits_total{outcome="admitted"} 3`; !strings.Contains(string(metrics), want) {
		t.Errorf("/metrics lacks %s", want)
	}

	cancel()
	cancel = nil
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if n := countHits(t, hits); n != 9 {
		t.Fatalf("hits topic holds %d hits, want the 9 admitted (each once)", n)
	}
}
