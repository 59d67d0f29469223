package main

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/streamlimit/streamlimit/internal/envoyfilter"
	"github.com/streamlimit/streamlimit/internal/testenv"
)

// startCommand runs the streamlimit command args until the test ends, and returns its
// output so far whenever asked.
func startCommand(t *testing.T, args ...string) func() string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out, done := runCommand(ctx, args...)
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("%s exited with %v\n%s", args[0], err, out())
		}
	})
	return out
}

// runCommand runs the streamlimit command args in process until ctx ends. It returns what
// the command printed so far, on demand, and the channel that receives its result.
func runCommand(ctx context.Context, args ...string) (func() string, <-chan error) {
	var out devOutput
	done := make(chan error, 1)
	go func() {
		cmd := newRootCmd()
		cmd.SetArgs(args)
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		done <- cmd.ExecuteContext(ctx)
	}()
	return out.String, done
}

// assignedOver connects an Envoy model to the RLQS server at addr, decides one request of
// bucket id in domain, and waits for the server's token bucket.
func assignedOver(t *testing.T, addr, domain string, id map[string]string) {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := envoyfilter.NewConn(ctx, envoyfilter.New(envoyfilter.Options{Domain: domain}), cc, nil)
	go func() { _ = c.Run(ctx) }()
	c.Decide(id, envoyfilter.Settings{ReportingInterval: time.Second})
	testenv.Eventually(t, 30*time.Second, "an assignment", func() bool { return c.Stats().Responses > 0 })
	if st, _ := c.Filter().Strategy(time.Now(), id); st.GetTokenBucket() == nil {
		t.Errorf("assignment %v, want a token bucket", st)
	}
}

var rlqsAddrRE = regexp.MustCompile(`rlqs (127\.0\.0\.1:\d+)`)

// TestEnforcerRLQS runs `streamlimit enforcer --rlqs-addr` (docs/api.md's command, without
// Kafka) and has an Envoy model get an assignment from it.
func TestEnforcerRLQS(t *testing.T) {
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(rules, []byte("domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 100}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	srv := serve(t, "enforcer", "--site", "eu", "--rules", rules, "--no-kafka", "--rlqs-addr", anyPort, "--rlqs-reporting-interval", "1s",
		"--http-listen", anyPort, "--grpc-listen", "off", "--log-level", "warn")
	assignedOver(t, srv.addr(t, "rlqs"), "api", map[string]string{"user": "42"})
}

// TestDevRLQS runs `streamlimit dev --rlqs-addr` and has an Envoy model get an assignment
// from it for the demo's rules.
func TestDevRLQS(t *testing.T) {
	out := startCommand(t, "dev", "--port", "0", "--http-listen", "127.0.0.1:0", "--grpc-listen", "off", "--rlqs-addr", "127.0.0.1:0", "--log-level", "error")
	var addr string
	testenv.Eventually(t, 30*time.Second, "dev printing its rlqs address", func() bool {
		if m := rlqsAddrRE.FindStringSubmatch(out()); m != nil {
			addr = m[1]
			return true
		}
		return false
	})
	assignedOver(t, addr, "demo", map[string]string{"client": "alice"})
}
