package envoycompat

import (
	"bytes"
	"context"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"

	"github.com/streamlimit/streamlimit/internal/testenv"
)

// switchLimit is the limit of the live-switch test's rules: per day, so that the window
// outlasts the test (switchGuard keeps its end away).
const switchLimit = 10

// switchGuard is the least time to the window's end the test starts with: more than the
// test takes (two builds are done before it is checked).
const switchGuard = 3 * time.Minute

// TestLiveSwitch follows docs/envoy-compat.md's "Switching a running deployment" on real
// Redis: a client spends half of its limit through the real envoyproxy/ratelimit, which is
// then stopped, and streamlimit — started as the document's command line says, in the
// same environment — gives it exactly the other half of the same window and then refuses
// it; then the other way round (a roll-back), for another client; then both at once,
// a client's requests alternating between them. Both count in the same Redis key, in
// envoyproxy/ratelimit's layout, which the test reads.
func TestLiveSwitch(t *testing.T) {
	line := switchCommand(t)
	theirBin := ratelimitBinary(t)
	ourBin := buildOurs(t)
	redisAddr := testenv.Redis(t)
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	t.Cleanup(func() { rdb.Close() })

	// Step 1: the running deployment's rules, Redis and environment, which both keep.
	root := t.TempDir()
	rulesDir := filepath.Join(root, "rl", "config")
	if err := os.MkdirAll(rulesDir, 0o755); err != nil {
		t.Fatal(err)
	}
	rulesFile := "domain: switch\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: " + strconv.Itoa(switchLimit) + "}\n"
	if err := os.WriteFile(filepath.Join(rulesDir, "switch.yaml"), []byte(rulesFile), 0o644); err != nil {
		t.Fatal(err)
	}
	prefix := "switch-" + randomHex(6) + ":"
	env := map[string]string{
		"PATH": os.Getenv("PATH"), "HOME": os.Getenv("HOME"),
		"USE_STATSD": "false", "LOG_LEVEL": "warn", "LOG_FORMAT": "text",
		"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": redisAddr, "CACHE_KEY_PREFIX": prefix,
		"RUNTIME_ROOT": root, "RUNTIME_SUBDIRECTORY": "rl", "RUNTIME_APPDIRECTORY": "config", "RUNTIME_WATCH_ROOT": "false",
		"EXPIRATION_JITTER_MAX_SECONDS": "0",
		"HOST":                          "127.0.0.1", "GRPC_HOST": "127.0.0.1", "DEBUG_HOST": "127.0.0.1",
	}

	// The window: a day, whose end the test keeps away from.
	now := time.Now()
	if left := now.Truncate(24 * time.Hour).Add(24 * time.Hour).Sub(now); left < switchGuard {
		t.Logf("waiting %v for the next day's window", left.Round(time.Second))
		time.Sleep(left + time.Second)
	}
	day := time.Now().Unix() / 86400 * 86400
	t.Cleanup(func() {
		if end := time.Now().Unix() / 86400 * 86400; end != day {
			t.Errorf("the window changed during the test (%d → %d): its counts say nothing", day, end)
		}
	})

	ask := func(t *testing.T, c rlsv3.RateLimitServiceClient, user string) *rlsv3.RateLimitResponse_DescriptorStatus {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		resp, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "switch", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: user}}}}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetStatuses()[0]
	}
	// spend sends n requests for user and checks the codes and remaining counts of a
	// client that had spent `from` of its limit.
	spend := func(t *testing.T, who string, c rlsv3.RateLimitServiceClient, user string, from, n int) {
		t.Helper()
		for i := range n {
			st := ask(t, c, user)
			spent := from + i + 1
			wantCode, wantLeft := rlsv3.RateLimitResponse_OK, uint32(switchLimit-spent)
			if spent > switchLimit {
				wantCode, wantLeft = rlsv3.RateLimitResponse_OVER_LIMIT, 0
			}
			if st.GetCode() != wantCode || st.GetLimitRemaining() != wantLeft {
				t.Fatalf("%s, request %d of the client (%d spent before): %v, %d remaining; want %v, %d", who, spent, from, st.GetCode(), st.GetLimitRemaining(), wantCode, wantLeft)
			}
		}
	}
	// counted checks the count in envoyproxy/ratelimit's key for user.
	counted := func(t *testing.T, user string, want int) {
		t.Helper()
		key := prefix + "switch_user_" + user + "_" + strconv.FormatInt(day, 10)
		got, err := rdb.Get(context.Background(), key).Int()
		ttl := rdb.TTL(context.Background(), key).Val()
		if err != nil || got != want || ttl <= 0 || ttl > 24*time.Hour {
			t.Fatalf("Redis key %s: %d (%v), TTL %v; want %d, at most a day", key, got, err, ttl, want)
		}
	}
	startTheirs := func(t *testing.T) (rlsv3.RateLimitServiceClient, func()) {
		grpcPort, httpPort, debugPort := testenv.FreePort(t), testenv.FreePort(t), testenv.FreePort(t)
		e := mapEnv(env, "GRPC_PORT", strconv.Itoa(grpcPort), "PORT", strconv.Itoa(httpPort), "DEBUG_PORT", strconv.Itoa(debugPort))
		stop := startProcess(t, "envoyproxy/ratelimit", theirBin, nil, e, nil)
		addr := "127.0.0.1:" + strconv.Itoa(grpcPort)
		waitListening(t, addr)
		return dial(t, addr), stop
	}
	// startOurs runs step 3's command line in the same environment, on ports of its own.
	startOurs := func(t *testing.T) (rlsv3.RateLimitServiceClient, func()) {
		grpcPort, httpPort := testenv.FreePort(t), testenv.FreePort(t)
		e := mapEnv(env, "GRPC_PORT", strconv.Itoa(grpcPort), "PORT", strconv.Itoa(httpPort))
		args := strings.Fields(os.Expand(line, func(k string) string { return e[k] }))
		started := make(chan string, 1)
		stop := startProcess(t, "streamlimit", ourBin, args[1:], e, started)
		select {
		case l := <-started:
			t.Logf("%s", l)
		case <-time.After(60 * time.Second):
			t.Fatal("streamlimit did not start within 60 s")
		}
		addr := "127.0.0.1:" + strconv.Itoa(grpcPort)
		waitListening(t, addr)
		return dial(t, addr), stop
	}

	t.Run("to streamlimit", func(t *testing.T) {
		user := "a" + randomHex(4)
		theirs, stopTheirs := startTheirs(t)
		spend(t, "envoyproxy/ratelimit", theirs, user, 0, switchLimit/2)
		counted(t, user, switchLimit/2)
		stopTheirs() // step 2
		ours, _ := startOurs(t)
		spend(t, "streamlimit", ours, user, switchLimit/2, switchLimit-switchLimit/2+1)
		counted(t, user, switchLimit+1)
	})
	t.Run("roll back", func(t *testing.T) {
		user := "b" + randomHex(4)
		ours, stopOurs := startOurs(t)
		spend(t, "streamlimit", ours, user, 0, switchLimit/2)
		counted(t, user, switchLimit/2)
		stopOurs() // step 5
		theirs, _ := startTheirs(t)
		spend(t, "envoyproxy/ratelimit", theirs, user, switchLimit/2, switchLimit-switchLimit/2+1)
		counted(t, user, switchLimit+1)
	})
	// A rolling switch: both serve at once, and a client's requests alternate between
	// them; each answers with the count the other left.
	t.Run("side by side", func(t *testing.T) {
		user := "c" + randomHex(4)
		theirs, _ := startTheirs(t)
		ours, _ := startOurs(t)
		for i := range switchLimit + 2 {
			c, who := theirs, "envoyproxy/ratelimit"
			if i%2 == 1 {
				c, who = ours, "streamlimit"
			}
			spend(t, who, c, user, i, 1)
		}
		counted(t, user, switchLimit+2)
	})
}

// switchCommand returns the command line of step 3 of docs/envoy-compat.md's "Switching a
// running deployment".
func switchCommand(t *testing.T) string {
	t.Helper()
	doc, err := os.ReadFile(testenv.RepoPath(t, "docs/envoy-compat.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(doc), "\n## Switching a running deployment\n")
	sec, _, _ = strings.Cut(sec, "\n## ")
	m := regexp.MustCompile("(?m)^\\s*```console\\n\\s*(streamlimit enforcer [^\\n]*)\\n").FindStringSubmatch(sec)
	if !ok || m == nil {
		t.Fatal(`docs/envoy-compat.md has no "Switching a running deployment" with a streamlimit enforcer command line`)
	}
	return m[1]
}

// buildOurs builds cmd/streamlimit into the test's directory.
func buildOurs(t *testing.T) string {
	t.Helper()
	testenv.RealParts(t)
	bin := filepath.Join(t.TempDir(), "streamlimit")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/streamlimit")
	cmd.Dir = testenv.RepoPath(t, ".")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/streamlimit: %v\n%s", err, out)
	}
	return bin
}

// mapEnv returns env with the pairs kv set.
func mapEnv(env map[string]string, kv ...string) map[string]string {
	out := make(map[string]string, len(env)+len(kv)/2)
	for k, v := range env {
		out[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		out[kv[i]] = kv[i+1]
	}
	return out
}

// startProcess runs bin with args in exactly env, and returns a function that stops it
// (SIGTERM, then SIGKILL after 10 s), also called when the test ends. When started is not
// nil, the first line of its standard output is sent there.
func startProcess(t *testing.T, name, bin string, args []string, env map[string]string, started chan<- string) func() {
	t.Helper()
	cmd := exec.Command(bin, args...)
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	slices.Sort(cmd.Env)
	var log testenv.SyncBuffer
	cmd.Stderr = &log
	cmd.Stdout = &firstLine{w: &log, started: started}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", name, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	}
	t.Cleanup(func() {
		stop()
		if t.Failed() {
			t.Logf("%s's log:\n%s", name, log.String())
		}
	})
	return stop
}

// firstLine writes to w, and sends the first line written to started (when not nil).
type firstLine struct {
	w       io.Writer
	started chan<- string
	line    []byte
	sent    bool
}

func (f *firstLine) Write(p []byte) (int, error) {
	if !f.sent && f.started != nil {
		f.line = append(f.line, p...)
		if i := bytes.IndexByte(f.line, '\n'); i >= 0 {
			f.sent = true
			f.started <- string(f.line[:i])
		}
	}
	return f.w.Write(p)
}

// waitListening waits until addr accepts connections.
func waitListening(t *testing.T, addr string) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, addr+" listening", func() bool {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
}
