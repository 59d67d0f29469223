package envoycompat

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/streamlimit/streamlimit"
	"github.com/streamlimit/streamlimit/clock"
	"github.com/streamlimit/streamlimit/enforcer/rules"
	"github.com/streamlimit/streamlimit/internal/testenv"
	"github.com/streamlimit/streamlimit/serve/rls"
	"github.com/streamlimit/streamlimit/serve/server"
)

// The envoyproxy/ratelimit whose tests and binary the package compares with.
const (
	RatelimitModule  = "github.com/envoyproxy/ratelimit"
	RatelimitVersion = "v1.4.1-0.20260122083618-3fb702589d36"
)

// moduleDir caches ratelimitSource's answer for the test binary.
var moduleDir struct {
	once sync.Once
	dir  string
	err  error
}

// ratelimitSource returns the directory of envoyproxy/ratelimit's module source at
// RatelimitVersion in the module cache, downloading it through the Go module proxy when
// it is not there yet. It ends the test with testenv.Unavailable when that fails.
func ratelimitSource(t testing.TB) string {
	t.Helper()
	testenv.RealParts(t) // runs the go tool, which may fetch from the module proxy
	moduleDir.once.Do(func() {
		cmd := exec.Command("go", "mod", "download", "-json", RatelimitModule+"@"+RatelimitVersion)
		cmd.Dir = os.TempDir() // outside any module: nothing of ours is touched
		var out, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &stderr
		if err := cmd.Run(); err != nil {
			moduleDir.err = fmt.Errorf("go mod download %s@%s: %v: %s%s", RatelimitModule, RatelimitVersion, err, stderr.String(), out.String())
			return
		}
		var info struct{ Dir, Error string }
		if err := json.Unmarshal(out.Bytes(), &info); err != nil || info.Dir == "" {
			moduleDir.err = fmt.Errorf("go mod download: no module directory in %q (%v, %s)", out.String(), err, info.Error)
			return
		}
		moduleDir.dir = info.Dir
	})
	if moduleDir.err != nil {
		testenv.Unavailable(t, "envoyproxy/ratelimit's source: %v", moduleDir.err)
	}
	return moduleDir.dir
}

// theirFile returns the contents of a file of envoyproxy/ratelimit's module source.
func theirFile(t testing.TB, rel string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(ratelimitSource(t), filepath.FromSlash(rel)))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// rulesDir makes a directory of rules files: theirs (paths in their module source, under
// the name of their last element, or renamed as "rel=name") and ours (name → YAML).
func rulesDir(t testing.TB, theirs []string, ours map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for _, rel := range theirs {
		name := filepath.Base(rel)
		if r, n, ok := strings.Cut(rel, "="); ok {
			rel, name = r, n
		}
		if err := os.WriteFile(filepath.Join(dir, name), theirFile(t, rel), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for name, body := range ours {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// target is a server under test: its gRPC client and /json URL.
type target struct {
	name    string
	rls     rlsv3.RateLimitServiceClient
	jsonURL string
}

func dial(t testing.TB, addr string) rlsv3.RateLimitServiceClient {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return rlsv3.NewRateLimitServiceClient(cc)
}

// ourOptions are the settings of one streamlimit server under test.
type ourOptions struct {
	rulesDir string
	compat   rules.Compat
	merge    bool
	envoy    rls.EnvoyOptions
	clock    clock.Clock // nil: the wall clock
	redis    string      // "": site counters in process
}

// theirRedisTimeout is envoyproxy/ratelimit's bound on a Redis call (REDIS_TIMEOUT,
// default 10 s: src/settings/settings.go), which the comparison gives streamlimit too. With
// its own default (sitestore.DefaultTimeout, 250 ms) a call that a loaded machine delays
// past it is answered on the site's share and its hit written back after, while Redis may
// still apply the late call: counted twice there, once at envoyproxy/ratelimit, which
// waits. That is streamlimit's degradation (tested in enforcer/sitestore), not a difference
// in what the two answer, and the likely cause of the one failed comparison under three
// CPU burners (streamlimit one hit ahead from one request on).
const theirRedisTimeout = 10 * time.Second

// startOurs runs streamlimit's enforcer server (without Kafka) until the test ends.
func startOurs(t testing.TB, o ourOptions) (target, *server.Server) {
	t.Helper()
	cfg := server.Config{
		Config: streamlimit.Config{
			Site:           "compat",
			Rules:          o.rulesDir,
			ReloadInterval: 20 * time.Millisecond,
			Load:           rules.LoadOptions{Compat: o.compat, MergeDomains: o.merge},
			Clock:          o.clock,
			Logger:         slog.New(slog.DiscardHandler),
		},
		HTTPAddr: "127.0.0.1:0",
		GRPCAddr: "127.0.0.1:0",
		Envoy:    o.envoy,
		Registry: prometheus.NewRegistry(),
	}
	if o.redis != "" {
		cfg.Redis.Addrs = []string{o.redis}
		cfg.Redis.KeyPrefix = "slcompat-" + randomHex(6) + ":"
		// Its own keys in envoyproxy/ratelimit's layout too: the servers of one test
		// share the Redis, and each starts with counters of its own.
		cfg.EnvoyKeyPrefix = cfg.Redis.KeyPrefix
		cfg.Redis.Timeout = theirRedisTimeout
	}
	srv, err := server.New(cfg)
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
	return target{name: "streamlimit", rls: dial(t, srv.GRPCAddr()), jsonURL: "http://" + srv.HTTPAddr() + "/json"}, srv
}

// jsonAnswer is what a /json request got.
type jsonAnswer struct {
	status      int
	contentType string
	body        string
}

func postJSON(t testing.TB, url, body string) jsonAnswer {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return jsonAnswer{status: resp.StatusCode, contentType: resp.Header.Get("Content-Type"), body: string(b)}
}

// ratelimitBinary returns envoyproxy/ratelimit's server (src/service_cmd) at
// RatelimitVersion, built with `go install` through the module proxy on first use and
// kept in the user's cache directory (streamlimit/envoy-ratelimit-VERSION), so that later
// runs start at once. It ends the test with testenv.Unavailable when it cannot be built.
func ratelimitBinary(t testing.TB) string {
	t.Helper()
	testenv.RealParts(t) // builds and runs envoyproxy/ratelimit
	cache, err := os.UserCacheDir()
	if err != nil {
		testenv.Unavailable(t, "no cache directory for envoyproxy/ratelimit's binary: %v", err)
	}
	dir := filepath.Join(cache, "streamlimit", "envoy-ratelimit-"+RatelimitVersion)
	bin := filepath.Join(dir, "service_cmd")
	if fi, err := os.Stat(bin); err == nil && fi.Mode().IsRegular() {
		return bin
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		testenv.Unavailable(t, "%v", err)
	}
	// Build into a directory of its own, then rename, so that a build cut short never
	// leaves a binary behind.
	tmp, err := os.MkdirTemp(dir, "build-")
	if err != nil {
		testenv.Unavailable(t, "%v", err)
	}
	defer os.RemoveAll(tmp)
	start := time.Now()
	cmd := exec.Command("go", "install", RatelimitModule+"/src/service_cmd@"+RatelimitVersion)
	cmd.Dir = os.TempDir()
	cmd.Env = append(os.Environ(), "GOBIN="+tmp, "GOFLAGS=")
	if out, err := cmd.CombinedOutput(); err != nil {
		testenv.Unavailable(t, "building envoyproxy/ratelimit %s: %v\n%s", RatelimitVersion, err, out)
	}
	if err := os.Rename(filepath.Join(tmp, "service_cmd"), bin); err != nil {
		testenv.Unavailable(t, "%v", err)
	}
	t.Logf("built envoyproxy/ratelimit %s in %v into %s", RatelimitVersion, time.Since(start).Round(time.Second), bin)
	return bin
}

// theirOptions are the settings of one envoyproxy/ratelimit server under test, as its
// environment variables.
type theirOptions struct {
	theirs []string          // rules files of its module source (see rulesDir)
	ours   map[string]string // rules files of this package
	env    map[string]string
	redis  string
}

// startTheirs runs envoyproxy/ratelimit with o until the test ends. It returns its target
// and its rules directory (RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY, whose
// *.yaml it loads).
func startTheirs(t testing.TB, bin string, o theirOptions) (target, string) {
	t.Helper()
	root := t.TempDir()
	dir := filepath.Join(root, "rl", "config")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.CopyFS(dir, os.DirFS(rulesDir(t, o.theirs, o.ours))); err != nil {
		t.Fatal(err)
	}
	base := []string{
		"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"),
		"USE_STATSD=false", "LOG_LEVEL=warn", "LOG_FORMAT=text",
		"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + o.redis, "CACHE_KEY_PREFIX=rlcompat-" + randomHex(6) + ":",
		"RUNTIME_ROOT=" + root, "RUNTIME_SUBDIRECTORY=rl", "RUNTIME_APPDIRECTORY=config", "RUNTIME_WATCH_ROOT=false",
		"EXPIRATION_JITTER_MAX_SECONDS=0",
	}
	for k, v := range o.env {
		base = append(base, k+"="+v)
	}
	for attempt := 1; ; attempt++ {
		grpcAddr, httpAddr, err := runTheirs(t, bin, base)
		if err == nil {
			return target{name: "envoyproxy/ratelimit", rls: dial(t, grpcAddr), jsonURL: "http://" + httpAddr + "/json"}, dir
		}
		if !errors.Is(err, errTheirPortTaken) || attempt == theirStartAttempts {
			t.Fatal(err)
		}
		t.Logf("%v; trying other ports", err)
	}
}

// theirStartAttempts bounds the ports one startTheirs tries.
const theirStartAttempts = 4

// errTheirPortTaken is a start of envoyproxy/ratelimit that could not bind its port.
var errTheirPortTaken = errors.New("envoyproxy/ratelimit found a port taken")

// runTheirs starts envoyproxy/ratelimit with env on loopback ports of its own, kills it
// when the test ends, and returns its gRPC and HTTP addresses once both answer.
//
// The ports are probed free just before (testenv.FreePort): envoyproxy/ratelimit cannot
// be handed a socket, and port 0 would leave the port it bound unknown, as it logs the
// address it was given. Another process may take one in between: the server then exits
// and the error is errTheirPortTaken, for another try on other ports. (It binds with
// SO_REUSEPORT, so a port held by another socket with that option, another
// envoyproxy/ratelimit of the same user, would be shared rather than refused: two of them
// probing the same free port at once is the one case left.)
func runTheirs(t testing.TB, bin string, env []string) (grpcAddr, httpAddr string, err error) {
	t.Helper()
	grpcPort, httpPort, debugPort := testenv.FreePort(t), testenv.FreePort(t), testenv.FreePort(t)
	cmd := exec.Command(bin)
	cmd.Env = append(slices.Clip(env),
		"HOST=127.0.0.1", "PORT="+strconv.Itoa(httpPort),
		"GRPC_HOST=127.0.0.1", "GRPC_PORT="+strconv.Itoa(grpcPort),
		"DEBUG_HOST=127.0.0.1", "DEBUG_PORT="+strconv.Itoa(debugPort))
	var log testenv.SyncBuffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		return "", "", fmt.Errorf("starting envoyproxy/ratelimit: %w", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	stop := func() {
		_ = cmd.Process.Kill()
		<-exited
	}
	grpcAddr = "127.0.0.1:" + strconv.Itoa(grpcPort)
	httpAddr = "127.0.0.1:" + strconv.Itoa(httpPort)
	// exitedErr is the error of a server that exited at start; its log says why.
	exitedErr := func() error {
		if strings.Contains(log.String(), "address already in use") {
			return fmt.Errorf("%w (gRPC %s, HTTP %s):\n%s", errTheirPortTaken, grpcAddr, httpAddr, log.String())
		}
		return fmt.Errorf("envoyproxy/ratelimit exited at start:\n%s", log.String())
	}
	deadline := time.Now().Add(20 * time.Second)
	for _, addr := range []string{grpcAddr, httpAddr} {
		for {
			c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
			if err == nil {
				c.Close()
				break
			}
			select {
			case <-exited:
				return "", "", exitedErr()
			default:
			}
			if time.Now().After(deadline) {
				stop()
				return "", "", fmt.Errorf("envoyproxy/ratelimit did not listen on %s:\n%s", addr, log.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	// What answered may have been whatever took a port: the server has exited then, or
	// is about to, its listener having failed.
	select {
	case <-exited:
		return "", "", exitedErr()
	case <-time.After(100 * time.Millisecond):
	}
	t.Cleanup(func() {
		stop()
		if t.Failed() {
			t.Logf("envoyproxy/ratelimit's log:\n%s", log.String())
		}
	})
	return grpcAddr, httpAddr, nil
}

// theirEnv is the environment that gives envoyproxy/ratelimit the settings of e.
func theirEnv(e rls.EnvoyOptions) map[string]string {
	env := map[string]string{}
	set := func(k string, on bool) {
		if on {
			env[k] = "true"
		}
	}
	set("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", e.StopIncrementWhenOverLimit)
	set("LIMIT_RESPONSE_HEADERS_ENABLED", e.ResponseHeaders)
	set("QUOTA_MODE", e.QuotaMode)
	set("SHADOW_MODE", e.ShadowMode)
	set("RESPONSE_DYNAMIC_METADATA", e.DynamicMetadata)
	for k, v := range map[string]string{"LIMIT_LIMIT_HEADER": e.LimitHeader, "LIMIT_REMAINING_HEADER": e.RemainingHeader, "LIMIT_RESET_HEADER": e.ResetHeader} {
		if v != "" {
			env[k] = v
		}
	}
	return env
}
