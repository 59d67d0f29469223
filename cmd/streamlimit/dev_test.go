package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamlimit/streamlimit/cmd/streamlimit/internal/demo"
	"github.com/streamlimit/streamlimit/enforcer/rules"
	"github.com/streamlimit/streamlimit/internal/testenv"
	"github.com/streamlimit/streamlimit/topics"
)

// devOutput is a bytes.Buffer safe for one writer and one reader at a time.
type devOutput struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *devOutput) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *devOutput) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestDevCountsAJSONHit starts `streamlimit dev --counts-format json` on a free port,
// publishes a JSON hit with a plain kgo client as any service would, and reads the hit's
// count back from the counts topic, as JSON, and with docs/records.md's kcat one-liner.
func TestDevCountsAJSONHit(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var out devOutput
	cmd := newRootCmd()
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs([]string{"dev", "--port", "0", "--http-listen", "127.0.0.1:0", "--grpc-listen", "off", "--log-level", "error", "--counts-format", "json"})
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("dev returned %v", err)
		}
	}()

	addrRE := regexp.MustCompile(`(?m)^  kafka +(127\.0\.0\.1:\d+)$`)
	var broker string
	for deadline := time.Now().Add(30 * time.Second); broker == ""; {
		if m := addrRE.FindStringSubmatch(out.String()); m != nil {
			broker = m[1]
			break
		}
		select {
		case err := <-done:
			t.Fatalf("dev exited: %v\n%s", err, out.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("dev printed no kafka address:\n%s", out.String())
		}
	}
	t.Logf("dev output:\n%s", out.String())

	key := "demo|client=dev-test#60s"
	cl, err := kgo.NewClient(kgo.SeedBrokers(broker), kgo.ConsumeTopics(topics.DefaultCountsTopic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	hit := fmt.Sprintf(`{"key":%q,"site":"eu","ts":%d,"w":60000,"n":3}`, key, time.Now().UnixMilli())
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topics.DefaultHitsTopic, Key: []byte(key), Value: []byte(hit)}).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}

	pollCtx, stop := context.WithTimeout(ctx, 60*time.Second)
	defer stop()
	for pollCtx.Err() == nil {
		fs := cl.PollFetches(pollCtx)
		if pollCtx.Err() != nil {
			t.Fatalf("no count for %q on the counts topic", key)
		}
		var got *topics.Count
		fs.EachRecord(func(r *kgo.Record) {
			if string(r.Key) != key || len(r.Value) == 0 {
				return
			}
			if r.Value[0] != '{' {
				t.Errorf("count record %q is not JSON under --counts-format json", r.Value)
			}
			c, err := topics.DecodeCount(r.Value)
			if err != nil {
				t.Errorf("decode count: %v", err)
				return
			}
			got = &c
		})
		if got != nil {
			if got.Total != 3 || got.Site("eu") != 3 || got.WindowDuration() != time.Minute {
				t.Fatalf("count %+v, want total 3 at site eu over 1m", *got)
			}
			break
		}
	}

	// dev serves /v1/auth for nginx (the client from X-Client-Id) and the aggregator's
	// metrics on the enforcer's /metrics.
	m := regexp.MustCompile(`http (127\.0\.0\.1:\d+) `).FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("dev printed no http address:\n%s", out.String())
	}
	req, _ := http.NewRequest("GET", "http://"+m[1]+"/v1/auth", nil)
	req.Header.Set("X-Client-Id", "dev-auth")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent || resp.Header.Get("RateLimit-Policy") == "" {
		t.Errorf("/v1/auth: %d %v, want 204 with the RateLimit fields", resp.StatusCode, resp.Header)
	}
	resp, err = http.Get("http://" + m[1] + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{"streamlimit_aggregator_", "streamlimit_enforcer_decisions_total"} {
		if !strings.Contains(string(metrics), want) {
			t.Errorf("dev /metrics lacks %s", want)
		}
	}

	// The analytics command sees it too.
	got, err := run(t, "counts", "get", key, "--brokers", broker)
	if err != nil || !regexp.MustCompile(`\beu\b`).MatchString(got) {
		t.Fatalf("counts get: %v\n%s", err, got)
	}

	// And so does docs/records.md's kcat one-liner for JSON counts, against this broker.
	doc, err := os.ReadFile("../../docs/records.md")
	if err != nil {
		t.Fatal(err)
	}
	line := regexp.MustCompile(`(?m)^kcat -C -b localhost:9092 -t counts .*$`).Find(doc)
	if line == nil {
		t.Fatal("docs/records.md has no kcat one-liner reading the counts topic")
	}
	testenv.Tool(t, "kcat", "apt-get install kcat")
	kctx, kstop := context.WithTimeout(ctx, 60*time.Second)
	defer kstop()
	kout, err := exec.CommandContext(kctx, "bash", "-c", strings.Replace(string(line), "localhost:9092", broker, 1)).CombinedOutput()
	if err != nil || !strings.Contains(string(kout), key+` {"key":`) || !strings.Contains(string(kout), `"total":3`) {
		t.Fatalf("docs/records.md kcat one-liner: %v\n%s", err, kout)
	}

	// docs/records.md's kcat command publishing a JSON hit: the aggregator counts it.
	pub := regexp.MustCompile("(?m)^printf .*\\|\n +kcat -P .*$").Find(doc)
	if pub == nil {
		t.Fatal("docs/records.md has no kcat command publishing a hit")
	}
	pubKey := regexp.MustCompile(`"key":"([^"]+)"`).FindSubmatch(pub)
	if pubKey == nil {
		t.Fatalf("docs/records.md's kcat command %s publishes no key", pub)
	}
	if out, err := exec.CommandContext(kctx, "bash", "-c", strings.Replace(string(pub), "localhost:9092", broker, 1)).CombinedOutput(); err != nil {
		t.Fatalf("docs/records.md's kcat command: %v\n%s", err, out)
	}
	testenv.Eventually(t, 60*time.Second, "the count of docs/records.md's hit", func() bool {
		got, err := run(t, "counts", "get", string(pubKey[1]), "--brokers", broker)
		return err == nil && regexp.MustCompile(`(?m)^eu-1 +1 `).MatchString(got)
	})
}

// TestDevHelpFlags checks that every flag of dev renders with its value type, not a
// phrase that pflag took from backquotes in the usage.
func TestDevHelpFlags(t *testing.T) {
	out, err := run(t, "dev", "--help")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"--rules string", "--http-config string"} {
		if !strings.Contains(out, want) {
			t.Errorf("dev --help lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "--rules streamlimit") {
		t.Errorf("dev --help names the rules flag's value after its usage:\n%s", out)
	}
}

// dev prints commands that the rules in force decide: with the demo's rules the ones it
// always printed, with a user's rules a request one of their global limits counts (the
// first rule that limits when none is global), open values and wildcards filled in, and
// no example at all for rules that limit nothing.
func TestDevExample(t *testing.T) {
	for _, tc := range []struct {
		name, yaml string
		key, check string
		window     time.Duration
		ok         bool
	}{
		{"demo", demo.RulesYAML, "demo|client=alice#5s",
			`{"domain":"demo","descriptors":[{"entries":[{"key":"client","value":"alice"}]}]}`, 5 * time.Second, true},
		{"global after a local", `
domain: shop
descriptors:
  - key: ip
    rate_limit: {unit: second, requests_per_unit: 5, scope: local}
  - key: plan
    value: gold
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 100}
`, "shop|plan=gold|user=alice#60s",
			`{"domain":"shop","descriptors":[{"entries":[{"key":"plan","value":"gold"},{"key":"user","value":"alice"}]}]}`, time.Minute, true},
		{"wildcard, site scope only", `
domain: api
descriptors:
  - key: api_key
    value: partner-*
    rate_limit: {unit: hour, requests_per_unit: 10, scope: site}
`, "api|api_key=partner-alice#3600s",
			`{"domain":"api","descriptors":[{"entries":[{"key":"api_key","value":"partner-alice"}]}]}`, time.Hour, true},
		{"nothing limited", `
domain: open
descriptors:
  - key: user
    rate_limit: {unlimited: true}
`, "", "", 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := rules.Parse("r.yaml", []byte(tc.yaml))
			if err != nil {
				t.Fatal(err)
			}
			ex, ok := devExample(cfg)
			if ok != tc.ok || ex.key != tc.key || ex.check != tc.check || ex.window != tc.window {
				t.Fatalf("devExample = %+v, %v; want key %q, check %s, window %v, %v", ex, ok, tc.key, tc.check, tc.window, tc.ok)
			}
			if !ok {
				return
			}
			// The key is the one the enforcer counts for the request.
			var body struct {
				Domain      string
				Descriptors []struct{ Entries []rules.Entry }
			}
			if err := json.Unmarshal([]byte(ex.check), &body); err != nil {
				t.Fatal(err)
			}
			r := cfg.Match(body.Domain, body.Descriptors[0].Entries)
			if r == nil {
				t.Fatalf("%s matches no rule", ex.check)
			}
		})
	}
}

// TestDevTopicsDescribe checks that `streamlimit topics describe` finds dev's topics as
// `topics ensure` makes them: dev's embedded broker holds production's layout.
func TestDevTopicsDescribe(t *testing.T) {
	broker, _ := startDev(t, "--port", "0", "--http-listen", "127.0.0.1:0", "--grpc-listen", "off", "--log-level", "error")
	var out bytes.Buffer
	cmd := newRootCmd()
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs([]string{"topics", "describe", "--brokers", broker})
	err := cmd.ExecuteContext(context.Background())
	if err != nil || strings.Contains(out.String(), "MISMATCH") || !strings.Contains(out.String(), "segment.ms") {
		t.Errorf("topics describe on dev's topics: %v\n%s", err, out.String())
	}
}
