package e2e_test

import (
	"bufio"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/streamlimit/streamlimit/internal/testenv"
)

// The tests of sites that come and go run the product's own binary, cmd/streamlimit, as
// child processes: a site that stops cleanly is a process that gets SIGTERM (and writes
// its leave records on the way out), a crash is SIGKILL.

// buildStreamlimit builds cmd/streamlimit of the repository at root into dir and returns the binary's path. It is
// built without the race detector whatever the test binary was built with: the children
// are the system under test at its production speed, on a machine the test loads anyway.
func buildStreamlimit(root, dir string) (string, error) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("the go tool builds cmd/streamlimit: %w", err)
	}
	bin := filepath.Join(dir, "streamlimit")
	cmd := exec.Command(goTool, "build", "-o", bin, "./cmd/streamlimit")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/streamlimit: %w\n%s", err, out)
	}
	return bin, nil
}

// buildStreamlimitAsync starts buildStreamlimit in the background (it takes seconds to
// tens of seconds, which the test can spend starting services) and returns a function
// that waits for the binary.
func buildStreamlimitAsync(t *testing.T) func() string {
	t.Helper()
	dir, root := t.TempDir(), testenv.RepoPath(t, ".")
	var (
		bin string
		err error
	)
	done := make(chan struct{})
	go func() {
		defer close(done)
		bin, err = buildStreamlimit(root, dir)
	}()
	t.Cleanup(func() { <-done })
	return func() string {
		t.Helper()
		<-done
		if err != nil {
			t.Fatal(err)
		}
		return bin
	}
}

// childEnviron is the environment of the children: only what a process needs to run, so
// that the variables a test run sets (STREAMLIMIT_KAFKA_BROKERS, LOG_LEVEL, ...) change
// no setting behind the flags the test gives.
func childEnviron() []string {
	var env []string
	for _, k := range []string{"PATH", "HOME", "TMPDIR"} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	return env
}

// anyPort is the listen address the tests give the children: port 0 on loopback. The
// child binds a free port of the system's choice, so that nothing else on the machine can
// take it between a choice and the bind, as it could a port probed free beforehand, and
// names it in the line it prints once listening (proc.addr reads it).
const anyPort = "127.0.0.1:0"

// listening matches the line a streamlimit server prints once its listeners are bound,
// capturing the HTTP address: the enforcer's "enforcer site eu: http 127.0.0.1:8081, ..."
// or the aggregator's "aggregator: admin 127.0.0.1:9090".
var listening = regexp.MustCompile(`(?m)^(?:enforcer site \S+: http|aggregator: admin) ([^\s,]+:\d+)`)

// restartAttempts bounds the starts of a restart that finds its port taken.
const restartAttempts = 4

// proc is a streamlimit child process serving HTTP on a loopback port of its first run's
// choice, kept across restarts (a restarted enforcer comes back where its load balancer
// expects it), ready when its /readyz answers 200.
type proc struct {
	t    *testing.T
	name string
	bin  string
	args []string
	// out holds the output of every run, for the test's checks and its failure report.
	out *testenv.SyncBuffer

	mu       sync.Mutex
	bound    string // the HTTP address, once the first run has named it
	runStart int    // where the current run's output starts in out
	cmd      *exec.Cmd
	exited   chan struct{}
	exitErr  error
	runs     int
}

// newProc returns a child that runs bin with args, which must give its HTTP listener
// anyPort. It is started by start, and stopped (SIGTERM, then SIGKILL) when the test ends;
// its output is logged when the test failed.
func newProc(t *testing.T, bin, name string, args ...string) *proc {
	p := &proc{t: t, name: name, bin: bin, args: args, out: &testenv.SyncBuffer{}}
	t.Cleanup(func() {
		if p.running() {
			p.signal(syscall.SIGTERM)
			select {
			case <-p.done():
			case <-time.After(15 * time.Second):
				p.signal(syscall.SIGKILL)
				<-p.done()
			}
		}
		if t.Failed() {
			lines := strings.Split(strings.TrimRight(p.out.String(), "\n"), "\n")
			t.Logf("output of %s (last 40 lines):\n%s", p.name, strings.Join(lines[max(0, len(lines)-40):], "\n"))
		}
	})
	return p
}

// serviceProcAttr starts a child as a service of its own: in a session of its own, as
// e2e/services starts the brokers, MirrorMakers and Redis (setsid), and killed when the
// test process dies, so that no child outlives an interrupted run.
//
// The session is what Linux's scheduler shares CPU between first (autogroup), before the
// threads of one session. As plain children, the enforcers and aggregators shared the
// session of whatever ran `make test` with everything else that session ran, and with three
// CPU-bound loops beside the run every wake-up of theirs waited behind them: in
// TestMultiClusterWAN the pipeline's age (a site's snapshot age) went from 0.8 s to a median
// of 3 s in the warm-up and 20 s later, every site was taken as silent and the aggregators'
// group sessions expired, while the brokers, in sessions of their own, were not short of
// CPU. In production each is a service of its own, scheduled as one; so it is here.
//
// Pdeathsig is sent when the thread that started the child exits, which the Go runtime
// does only for a goroutine that exits locked to its thread; none of the tests does that.
func serviceProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL}
}

// start starts the process; it does not wait for it to be ready.
func (p *proc) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.exited != nil && !closed(p.exited) {
		return fmt.Errorf("%s is running", p.name)
	}
	p.parseAddr()
	args := slices.Clone(p.args)
	if p.bound != "" {
		// A restart binds the port the first run was given: it was the process's until
		// it exited, and anything may have taken it since (waitReady retries).
		for i, a := range args {
			if a == anyPort {
				args[i] = p.bound
			}
		}
	}
	p.runs++
	fmt.Fprintf(p.out, "--- %s run %d\n", p.name, p.runs)
	p.runStart = len(p.out.String())
	cmd := exec.Command(p.bin, args...)
	cmd.Env = childEnviron()
	cmd.SysProcAttr = serviceProcAttr()
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", p.name, err)
	}
	exited := make(chan struct{})
	p.cmd, p.exited, p.exitErr = cmd, exited, nil
	go func() {
		err := cmd.Wait()
		p.mu.Lock()
		p.exitErr = err
		p.mu.Unlock()
		close(exited)
	}()
	return nil
}

func closed(c chan struct{}) bool {
	if c == nil {
		return true
	}
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// done returns a channel closed when the current run has exited.
func (p *proc) done() chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.exited == nil {
		c := make(chan struct{})
		close(c)
		return c
	}
	return p.exited
}

func (p *proc) running() bool { return !closed(p.done()) }

func (p *proc) signal(sig syscall.Signal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil && p.cmd.Process != nil {
		_ = p.cmd.Process.Signal(sig)
	}
}

// addr returns the process's HTTP address, "" until its first run has named it.
func (p *proc) addr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.parseAddr()
	return p.bound
}

// parseAddr sets p.bound from the output once the first run has printed it; p.mu is held.
func (p *proc) parseAddr() {
	if p.bound == "" {
		if m := listening.FindStringSubmatch(p.out.String()); m != nil {
			p.bound = m[1]
		}
	}
}

// portTaken reports whether the current run failed to bind its port.
func (p *proc) portTaken() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Contains(p.out.String()[p.runStart:], "address already in use")
}

// ready reports whether /readyz answers 200.
func (p *proc) ready() bool {
	addr := p.addr()
	if addr == "" {
		return false
	}
	resp, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// waitReady waits until the process is ready; an error if it exits or timeout passes
// first. A restart that found its port taken is started again, a few times, as the port
// may be free again a moment later.
func (p *proc) waitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for attempt := 1; !p.ready(); {
		if !p.running() {
			if attempt < restartAttempts && p.portTaken() {
				time.Sleep(time.Duration(attempt) * 250 * time.Millisecond)
				attempt++
				if err := p.start(); err != nil {
					return err
				}
				continue
			}
			return fmt.Errorf("%s exited before it was ready: %v", p.name, p.exitError())
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %v", p.name, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}

func (p *proc) exitError() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exitErr
}

// stop sends SIGTERM, as an orchestrator stopping a pod does, and waits for the process
// to exit; an error if it did not within timeout or exited with a failure (an enforcer
// whose hits or leave records were not delivered exits with status 1). It returns when
// the process exited.
func (p *proc) stop(timeout time.Duration) (time.Time, error) {
	p.signal(syscall.SIGTERM)
	select {
	case <-p.done():
	case <-time.After(timeout):
		p.signal(syscall.SIGKILL)
		<-p.done()
		return time.Now(), fmt.Errorf("%s did not stop within %v of SIGTERM", p.name, timeout)
	}
	at := time.Now()
	if err := p.exitError(); err != nil {
		return at, fmt.Errorf("%s exited with %v after SIGTERM", p.name, err)
	}
	return at, nil
}

// kill sends SIGKILL (a crash: no leave record, no last flush) and waits for the exit.
func (p *proc) kill() {
	p.signal(syscall.SIGKILL)
	<-p.done()
}

// metrics scrapes the process's /metrics, keeping the samples whose names start with one of
// prefixes (all without any); nil and an error when it cannot. Lines that are not kept are
// not parsed: the test scrapes often, from a binary built with the race detector.
func (p *proc) metrics(prefixes ...string) ([]sample, error) {
	resp, err := http.Get("http://" + p.addr() + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, errors.New(resp.Status)
	}
	var keep strings.Builder
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		if len(prefixes) > 0 && !slices.ContainsFunc(prefixes, func(pre string) bool { return strings.HasPrefix(line, pre) }) {
			continue
		}
		keep.WriteString(line)
		keep.WriteByte('\n')
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	var out []sample
	var perr error
	// parseMetrics fails its testing.TB; a scrape off the test goroutine reports instead.
	func() {
		defer func() {
			if r := recover(); r != nil {
				perr = fmt.Errorf("%v", r)
			}
		}()
		out = parseMetrics(panicTB{p.t}, strings.NewReader(keep.String()))
	}()
	return out, perr
}

// panicTB turns a fatal failure into a panic, which proc.metrics recovers, so that
// parseMetrics can run off the test's goroutine.
type panicTB struct{ testing.TB }

func (panicTB) Helper()                           {}
func (panicTB) Fatal(args ...any)                 { panic(fmt.Sprint(args...)) }
func (panicTB) Fatalf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }
