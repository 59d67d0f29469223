package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/streamlimit/streamlimit/internal/testenv"
	"github.com/streamlimit/streamlimit/serve/httplimit"
)

// TestDocsAPIDelay runs docs/api.md's "Delay instead of 429" commands: the enforcer command
// line (with the test's broker, upstream, ports and a rules directory substituted), the
// curl request's body three times against its check API, three requests through its
// proxy and three to its nginx endpoint. The third of each, over a limit of 2 per second,
// waits and is admitted (the nginx endpoint's limit refills a token every 50 ms). The
// page's example answer must decode as a check response and match the real one.
func TestDocsAPIDelay(t *testing.T) {
	sec := docSection(t, "../../docs/api.md", "## Delay instead of 429")
	_, cmds, _ := strings.Cut(sec, "```sh\n")
	cmds, _, _ = strings.Cut(cmds, "```")
	_, example, _ := strings.Cut(sec, "```json\n")
	example, _, _ = strings.Cut(example, "```")
	var exampleResp httplimit.CheckResponse
	d := json.NewDecoder(strings.NewReader(example))
	d.DisallowUnknownFields()
	if err := d.Decode(&exampleResp); err != nil || exampleResp.WaitedMs <= 0 {
		t.Fatalf("docs/api.md's example check answer %q: %v (waited_ms %d)", example, err, exampleResp.WaitedMs)
	}
	lines := strings.Split(strings.TrimSpace(cmds), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "streamlimit enforcer ") || !strings.HasPrefix(lines[1], "curl -s -d '") {
		t.Fatalf("docs/api.md delay commands %q: want the enforcer and one curl", lines)
	}
	_, body, _ := strings.Cut(lines[1], "-d '")
	body, _, _ = strings.Cut(body, "'")

	dir := t.TempDir()
	for name, y := range map[string]string{
		"api.yaml": "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 2}\n",
		"http.yaml": "domain: http\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: second, requests_per_unit: 2}\n" +
			"  - key: remote_address\n    value: 10.0.0.9\n    rate_limit: {unit: second, requests_per_unit: 20, scope: local, algorithm: token_bucket, burst: 2}\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(y), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var upstreamHits atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { upstreamHits.Add(1) }))
	t.Cleanup(up.Close) // after the enforcer, which stops when the test ends
	args := shellWords(t, lines[0])[1:]
	for i := range args {
		switch args[i-min(i, 1)] {
		case "--rules":
			args[i] = dir
		case "--brokers":
			args[i] = testenv.Kafka(t)
		case "--upstream":
			args[i] = up.URL
		}
	}
	args = append(args, "--http-listen", anyPort, "--proxy-listen", anyPort, "--grpc-listen", "off", "--log-level", "warn",
		"--hits-topic", testenv.CreateTopic(t, "hits", 1, nil), "--counts-topic", testenv.CreateTopic(t, "counts", 1, nil))
	srv := serve(t, args...)
	httpAddr, proxyAddr := srv.addr(t, "http"), srv.addr(t, "proxy")

	var answers []httplimit.CheckResponse
	deadline := time.Now().Add(60 * time.Second)
	for len(answers) < 3 {
		resp, err := http.Post("http://"+httpAddr+"/v1/check", "application/json", strings.NewReader(body))
		if err != nil {
			if time.Now().After(deadline) {
				t.Fatalf("enforcer never answered: %v", err)
			}
			time.Sleep(100 * time.Millisecond)
			continue
		}
		var cr httplimit.CheckResponse
		err = json.NewDecoder(resp.Body).Decode(&cr)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		answers = append(answers, cr)
	}
	last := answers[2]
	if last.OverallCode != "OK" || last.WaitedMs <= 0 {
		t.Fatalf("third check: %+v, want admitted after waiting", last)
	}
	// The doc's answer is this one, but for the wait, what is left (the first two
	// requests may fall in one sub-bucket of the window or two), the fallback flag (no
	// aggregator runs here) and the header fields it leaves out.
	last.WaitedMs, last.ResponseHeadersToAdd, last.Statuses[0].Fallback = exampleResp.WaitedMs, nil, false
	last.Statuses[0].LimitRemaining = exampleResp.Statuses[0].LimitRemaining
	got, _ := json.Marshal(last)
	want, _ := json.Marshal(exampleResp)
	if !reflect.DeepEqual(got, want) || string(want) != strings.TrimSpace(example) {
		t.Errorf("docs/api.md's example answer\n%s\ndiffers from the real one\n%s", want, got)
	}

	var codes []int
	for range 3 {
		resp, err := http.Post("http://"+proxyAddr+"/", "text/plain", bytes.NewReader(nil))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		codes = append(codes, resp.StatusCode)
	}
	if codes[2] != http.StatusOK || upstreamHits.Load() != 3 {
		t.Fatalf("proxy statuses %v, upstream saw %d; want the third held and forwarded", codes, upstreamHits.Load())
	}

	// A bucket of 2 refilled every 50 ms: the third request waits up to 50 ms, within
	// --auth-max-delay.
	codes = codes[:0]
	for range 3 {
		req, _ := http.NewRequest("GET", "http://"+httpAddr+"/v1/auth", nil)
		req.Header.Set("X-Real-IP", "10.0.0.9")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		codes = append(codes, resp.StatusCode)
	}
	if codes[2] != http.StatusNoContent {
		t.Fatalf("nginx endpoint statuses %v; want the third held and admitted", codes)
	}
}
