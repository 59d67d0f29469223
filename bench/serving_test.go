package bench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/streamlimit/streamlimit/enforcer/server"
)

// serveEnv, when set in the environment of this test binary, makes it an enforcer server
// instead of a test run: its value is the rules file. The serving benchmark starts the
// binary that way, so that the server is a separate process that can be pinned to its own
// core, as `streamlimit enforcer --no-kafka` would be, without building the command.
const serveEnv = "STREAMLIMIT_BENCH_SERVE"

func TestMain(m *testing.M) {
	if rules := os.Getenv(serveEnv); rules != "" {
		os.Exit(serve(rules))
	}
	os.Exit(m.Run())
}

// serve runs an enforcer server without Kafka on loopback ports, prints "ADDR http grpc"
// on stdout, and serves until stdin is closed or a SIGTERM arrives; the exit code is 0 after
// a clean shutdown.
func serve(rulesPath string) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	ctx, cancel := context.WithCancel(ctx)
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); cancel() }()
	srv, err := server.New(server.Config{
		Site: "bench", RulesPath: rulesPath, HTTPAddr: "127.0.0.1:0", GRPCAddr: "127.0.0.1:0",
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Printf("ADDR %s %s\n", srv.HTTPAddr(), srv.GRPCAddr())
	if err := srv.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// servingRules is one global rule, the production case. Without Kafka the server decides
// it on its default share (1) of the limit, counting exactly in process; the limit is high
// so that every one of the 10 k keys stays admitted and every call takes the full path.
const servingRules = `
domain: api
descriptors:
  - key: user
    rate_limit: {name: per-minute, unit: minute, requests_per_unit: 1000000000}
`

const servingKeys = 10_000

// servingWorkers are the concurrencies measured: one caller (latency without queueing)
// and 16 (enough to saturate one server core).
var servingWorkers = []int{1, 16}

// BenchmarkServing measures the enforcer's serving APIs from a real client: POST /v1/check
// with net/http (keep-alive, one connection per worker) and ShouldRateLimit with a gRPC
// client (one HTTP/2 connection shared by the workers, as Envoy does), over loopback TCP,
// with a global rule and 10 k keys used round-robin. It reports req/s and the p50 and p99
// of per-call latency as seen by the caller.
//
// The server is this test binary re-executed as an enforcer server (see serveEnv). With
// two or more cores and taskset available, the server is pinned to core 0 (GOMAXPROCS 1)
// and this process, the load generator, to core 1 (GOMAXPROCS 1) for the duration; the
// broker and anything else on the machine are not pinned and share both cores.
func BenchmarkServing(b *testing.B) {
	pinned := pinSelf(b)
	httpAddr, grpcAddr := startServer(b, pinned)

	bodies := make([][]byte, servingKeys)
	reqs := make([]*rlsv3.RateLimitRequest, servingKeys)
	for i := range servingKeys {
		v := strconv.Itoa(i)
		bodies[i] = []byte(`{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"` + v + `"}]}]}`)
		reqs[i] = &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: v}}},
		}}
	}

	var httpWarm, grpcWarm bool
	for _, w := range servingWorkers {
		b.Run("api=http/workers="+strconv.Itoa(w), func(b *testing.B) {
			tr := &http.Transport{MaxIdleConnsPerHost: w, MaxConnsPerHost: w, DisableCompression: true}
			defer tr.CloseIdleConnections()
			client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
			url := "http://" + httpAddr + "/v1/check"
			call := func(i int, buf *bytes.Buffer) error {
				resp, err := client.Post(url, "application/json", bytes.NewReader(bodies[i]))
				if err != nil {
					return err
				}
				buf.Reset()
				_, err = buf.ReadFrom(resp.Body)
				resp.Body.Close()
				if err != nil {
					return err
				}
				if resp.StatusCode != http.StatusOK || !bytes.Contains(buf.Bytes(), []byte(`"overall_code":"OK"`)) {
					return fmt.Errorf("status %d: %s", resp.StatusCode, buf.Bytes())
				}
				return nil
			}
			drive(b, w, pinned, &httpWarm, call)
		})
	}
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	rls := rlsv3.NewRateLimitServiceClient(conn)
	for _, w := range servingWorkers {
		b.Run("api=grpc/workers="+strconv.Itoa(w), func(b *testing.B) {
			ctx := context.Background()
			call := func(i int, _ *bytes.Buffer) error {
				resp, err := rls.ShouldRateLimit(ctx, reqs[i])
				if err != nil {
					return err
				}
				if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
					return fmt.Errorf("overall code %v", resp.GetOverallCode())
				}
				return nil
			}
			drive(b, w, pinned, &grpcWarm, call)
		})
	}
}

// drive makes b.N calls from workers goroutines, keys round-robin, and reports req/s, p50,
// p99 and whether server and generator were pinned to separate cores (1) or not (0). The first time for an API (*warmed false) it first calls once with every key,
// so that the server holds all 10 k counters before the timing starts.
func drive(b *testing.B, workers int, pinned bool, warmed *bool, call func(i int, buf *bytes.Buffer) error) {
	if !*warmed {
		var buf bytes.Buffer
		for i := range servingKeys {
			if err := call(i, &buf); err != nil {
				b.Fatalf("warm-up: %v", err)
			}
		}
		*warmed = true
	}
	var (
		next   atomic.Int64
		failed atomic.Bool
		mu     sync.Mutex
		lats   = make([]time.Duration, 0, b.N)
		wg     sync.WaitGroup
	)
	b.ResetTimer()
	start := time.Now()
	for range workers {
		wg.Go(func() {
			var buf bytes.Buffer
			local := make([]time.Duration, 0, b.N/workers+1)
			for {
				n := next.Add(1)
				if n > int64(b.N) || failed.Load() {
					break
				}
				t := time.Now()
				err := call(int(n%servingKeys), &buf)
				local = append(local, time.Since(t))
				if err != nil {
					if !failed.Swap(true) {
						b.Errorf("call: %v", err)
					}
					break
				}
			}
			mu.Lock()
			lats = append(lats, local...)
			mu.Unlock()
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if len(lats) == 0 {
		return
	}
	slices.Sort(lats)
	pct := func(p float64) float64 { return float64(lats[int(p*float64(len(lats)-1))]) / 1e3 }
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "req/s")
	b.ReportMetric(pct(0.50), "p50-µs")
	b.ReportMetric(pct(0.99), "p99-µs")
	pin := 0.0
	if pinned {
		pin = 1
	}
	b.ReportMetric(pin, "pinned")
}

// pinSelf pins every thread of this process to core 1 and sets GOMAXPROCS to 1, undoing
// both when b ends. It reports false, changing nothing, on a single core or without
// taskset.
func pinSelf(b *testing.B) bool {
	b.Helper()
	orig := allowedCPUs()
	if runtime.NumCPU() < 2 || orig == "" {
		b.Logf("not pinned: %d CPU(s); server and load generator share them", runtime.NumCPU())
		return false
	}
	if _, err := exec.LookPath("taskset"); err != nil {
		b.Logf("not pinned: taskset not found; server and load generator share the cores")
		return false
	}
	pid := strconv.Itoa(os.Getpid())
	if out, err := exec.Command("taskset", "-a", "-p", "-c", "1", pid).CombinedOutput(); err != nil {
		b.Logf("not pinned: taskset: %v: %s", err, out)
		return false
	}
	procs := runtime.GOMAXPROCS(1)
	b.Cleanup(func() {
		runtime.GOMAXPROCS(procs)
		if out, err := exec.Command("taskset", "-a", "-p", "-c", orig, pid).CombinedOutput(); err != nil {
			b.Errorf("restoring CPU affinity %s: %v: %s", orig, err, out)
		}
	})
	b.Logf("server pinned to core 0 (GOMAXPROCS 1), load generator to core 1 (GOMAXPROCS 1)")
	return true
}

// allowedCPUs returns this process's CPU list from /proc/self/status ("0-1"), "" if unknown.
func allowedCPUs() string {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return ""
	}
	for line := range strings.Lines(string(data)) {
		if v, ok := strings.CutPrefix(line, "Cpus_allowed_list:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// startServer starts the enforcer server process (pinned to core 0 when pinned) and stops
// it when b ends, failing b if it did not shut down cleanly.
func startServer(b *testing.B, pinned bool) (httpAddr, grpcAddr string) {
	b.Helper()
	rulesPath := filepath.Join(b.TempDir(), "rules.yaml")
	if err := os.WriteFile(rulesPath, []byte(servingRules), 0o644); err != nil {
		b.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	var cmd *exec.Cmd
	if pinned {
		cmd = exec.Command("taskset", "-c", "0", exe)
	} else {
		cmd = exec.Command(exe)
	}
	cmd.Env = append(os.Environ(), serveEnv+"="+rulesPath)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	done := make(chan error, 1)
	b.Cleanup(func() {
		_ = stdin.Close()
		select {
		case err := <-done:
			if err != nil {
				b.Errorf("enforcer server: %v: %s", err, stderr.Bytes())
			}
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			b.Errorf("enforcer server did not stop within 30s: %s", stderr.Bytes())
		}
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	go func() { _, _ = io.Copy(io.Discard, stdout); done <- cmd.Wait() }()
	f := strings.Fields(line)
	if err != nil || len(f) != 3 || f[0] != "ADDR" {
		b.Fatalf("enforcer server did not start: %q %v: %s", line, err, stderr.Bytes())
	}
	return f[1], f[2]
}
