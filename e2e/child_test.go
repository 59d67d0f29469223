package e2e_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/streamlimit/streamlimit/aggregator"
	"github.com/streamlimit/streamlimit/internal/testenv"
)

// childEnv, when set in the environment, makes the test binary run one aggregator instead
// of the tests: the fault tests start aggregators as separate processes of this binary so
// that they can kill them with SIGKILL (no LeaveGroup, no flush) and read their RSS alone.
const childEnv = "STREAMLIMIT_E2E_AGGREGATOR"

// childConfig is the aggregator configuration passed to a child, as JSON in childEnv.
type childConfig struct {
	Brokers      []string
	TopicPattern string
	CountsTopic  string
	Group        string
	InstanceID   string
	MaxKeys      int
	MaxWindow    time.Duration
	// SessionTimeout of the group member (aggregator.Config.SessionTimeout): how long the
	// group waits for a killed member before giving its partitions to the others.
	SessionTimeout time.Duration
	// LogLevel of the child's log, which goes to the test's log: "warn" when empty.
	LogLevel string
}

func TestMain(m *testing.M) {
	if v := os.Getenv(childEnv); v != "" {
		os.Exit(runChild(v))
	}
	os.Exit(m.Run())
}

// runChild runs an aggregator with an admin server on a free loopback port, whose address
// it prints as the first line of stdout. It exits when stdin closes (the parent died) or on
// SIGTERM, as the streamlimit command does: Run returns once it has left the group.
func runChild(cfgJSON string) int {
	var cc childConfig
	if err := json.Unmarshal([]byte(cfgJSON), &cc); err != nil {
		fmt.Fprintln(os.Stderr, "child config:", err)
		return 2
	}
	level := slog.LevelWarn
	if cc.LogLevel != "" {
		if err := level.UnmarshalText([]byte(cc.LogLevel)); err != nil {
			fmt.Fprintln(os.Stderr, "child log level:", err)
			return 2
		}
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	reg := prometheus.NewRegistry()
	agg, err := aggregator.New(aggregator.Config{
		Brokers: cc.Brokers, TopicPattern: cc.TopicPattern, CountsTopic: cc.CountsTopic, Group: cc.Group,
		InstanceID: cc.InstanceID, MaxKeys: cc.MaxKeys, MaxWindow: cc.MaxWindow, SessionTimeout: cc.SessionTimeout,
		Logger: log, Registerer: reg,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "aggregator:", err)
		return 2
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, "listen:", err)
		return 2
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !agg.Ready() {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		fmt.Fprintf(w, "keys %d\n", agg.Keys())
	})
	go func() { _ = http.Serve(ln, mux) }()
	fmt.Println(ln.Addr().String())

	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer cancel()
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); cancel() }()
	if err := agg.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "aggregator:", err)
		return 1
	}
	return 0
}

// child is an aggregator process started by startChild.
type child struct {
	t     *testing.T
	cmd   *exec.Cmd
	stdin io.WriteCloser
	addr  string
	name  string
}

func startChild(t *testing.T, name string, cc childConfig) *child {
	t.Helper()
	testenv.RealParts(t) // a process of its own
	b, err := json.Marshal(cc)
	if err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	c := &child{t: t, name: name, cmd: exec.Command(exe, "-test.run=^$")}
	c.cmd.Env = append(os.Environ(), childEnv+"="+string(b))
	c.cmd.Stderr = tlogWriter{t}
	if c.stdin, err = c.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	out, err := c.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatalf("starting aggregator %s: %v", name, err)
	}
	t.Cleanup(c.kill)
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("aggregator %s printed no address: %v", name, err)
	}
	c.addr = strings.TrimSpace(line)
	go func() { _, _ = io.Copy(io.Discard, out) }()
	return c
}

// kill sends SIGKILL: the process gets no chance to leave the group or flush.
func (c *child) kill() {
	if c.cmd.Process == nil || c.cmd.ProcessState != nil {
		return
	}
	_ = c.cmd.Process.Signal(syscall.SIGKILL)
	_ = c.cmd.Wait()
}

// term sends SIGTERM and waits for the process to exit (at most timeout, then SIGKILL), and
// returns how long it took.
func (c *child) term(timeout time.Duration) time.Duration {
	c.t.Helper()
	start := time.Now()
	if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		c.t.Fatalf("SIGTERM to aggregator %s: %v", c.name, err)
	}
	done := make(chan error, 1)
	go func() { done <- c.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			c.t.Errorf("aggregator %s after SIGTERM: %v", c.name, err)
		}
	case <-time.After(timeout):
		c.t.Errorf("aggregator %s still running %v after SIGTERM", c.name, timeout)
		_ = c.cmd.Process.Signal(syscall.SIGKILL)
		<-done
	}
	return time.Since(start)
}

func (c *child) ready() bool {
	resp, err := http.Get("http://" + c.addr + "/readyz")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

func (c *child) metrics() []sample { return scrape(c.t, "http://"+c.addr+"/metrics") }

func (c *child) pid() int { return c.cmd.Process.Pid }

// waitReady polls until the child is ready and returns how long that took.
func (c *child) waitReady(timeout time.Duration) time.Duration {
	c.t.Helper()
	start := time.Now()
	eventually(c.t, timeout, "aggregator "+c.name+" ready", c.ready)
	return time.Since(start)
}

// assigned returns how many hits partitions the child consumes (from its lag gauge).
func (c *child) assigned() int {
	n := 0
	for _, s := range c.metrics() {
		if s.name == "streamlimit_aggregator_consume_lag_records" {
			n++
		}
	}
	return n
}
