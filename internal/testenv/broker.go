package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Broker is a Kafka broker private to one test, run by
// e2e/services/kafka.sh in a run directory under t.TempDir(). Fault tests
// use it to stop and restart a broker without disturbing the shared broker
// that other tests, and other test packages running at the same time, use.
// A Broker is not safe for simultaneous use by multiple goroutines.
type Broker struct {
	t      testing.TB
	script string
	dir    string
	addr   string
	env    []string // extra environment of kafka.sh
	kept   bool     // stopped with its data and ports, to come back on them
}

// PrivateKafka starts a private single-node broker and stops it, removing
// its data, in t.Cleanup. It needs the repository's kafka.sh and a JDK with
// Maven (which `make test` also needs); without them it skips, or fails
// under CI=true. Starting takes several seconds, so use it only where a test
// must stop or restart Kafka.
func PrivateKafka(t testing.TB) *Broker {
	t.Helper()
	return PrivateKafkaEnv(t)
}

// PrivateKafkaEnv is PrivateKafka with extra environment for kafka.sh, e.g.
// "STREAMLIMIT_KAFKA_EXTRA_PROPERTIES=<file>" to add a secured listener.
func PrivateKafkaEnv(t testing.TB, env ...string) *Broker {
	t.Helper()
	RealParts(t)
	script, err := kafkaScript()
	if err != nil {
		missing(t, "kafka.sh", "Kafka (private broker)", err)
		return nil
	}
	b := &Broker{t: t, script: script, dir: t.TempDir(), env: env}
	t.Cleanup(func() {
		if err := b.run("stop"); err != nil {
			t.Errorf("testenv: stopping private Kafka: %v", err)
		}
	})
	b.Start()
	return b
}

// Addr returns the broker's bootstrap address, host:port. It stays the same
// across Stop(true) and Start.
func (b *Broker) Addr() string { return b.addr }

// Start starts the broker if it is not running, waits until it answers a
// metadata request, and returns its address. After Stop(true) it comes back
// on the same address with the same data.
func (b *Broker) Start() string {
	b.t.Helper()
	attempts := kafkaStartAttempts
	if b.kept {
		attempts = 1 // its ports are kept: new ones would be another broker
	}
	out, err := runKafkaStart(b.t.Logf, b.output, nil, attempts)
	if err != nil {
		b.t.Fatalf("testenv: starting private Kafka: %v", err)
	}
	b.addr = out
	return out
}

// Stop stops the broker (SIGTERM, then SIGKILL after 30 s). With keepData
// the data directory and ports survive for a later Start; without it they
// are removed and the next Start is a fresh, empty broker on new ports.
func (b *Broker) Stop(keepData bool) {
	b.t.Helper()
	args := []string{"stop"}
	if keepData {
		args = append(args, "--keep-data")
	}
	if err := b.run(args...); err != nil {
		b.t.Fatalf("testenv: stopping private Kafka: %v", err)
	}
	b.kept = keepData
}

// Signal sends sig to the broker's process: SIGSTOP and SIGCONT pause and resume it, as a
// long pause (a collector, a frozen disk, a starved VM) stalls a broker that keeps its
// connections open.
func (b *Broker) Signal(sig syscall.Signal) error {
	raw, err := os.ReadFile(filepath.Join(b.dir, "kafka", "kafka.pid"))
	if err != nil {
		return fmt.Errorf("testenv: the private broker's pid: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil {
		return fmt.Errorf("testenv: the private broker's pid file: %w", err)
	}
	// kafka.sh records the pid of `setsid nohup java …`, which each exec the next: make
	// sure it is the JVM, not a wrapper that would stop while the broker runs on.
	if comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); err == nil && strings.TrimSpace(string(comm)) != "java" {
		return fmt.Errorf("testenv: pid %d of the private broker is %q, not the JVM", pid, strings.TrimSpace(string(comm)))
	}
	if err := syscall.Kill(pid, sig); err != nil {
		return fmt.Errorf("testenv: signalling the private broker: %w", err)
	}
	return nil
}

// ExtraAddr returns 127.0.0.1:<the port kafka.sh put for @XPORT@> in the broker's extra
// properties (STREAMLIMIT_KAFKA_EXTRA_PROPERTIES): the address of an extra listener, such
// as a SASL one, whose port kafka.sh chose with the others, so that a start that finds it
// taken is retried on another like them (see runKafkaStart).
func (b *Broker) ExtraAddr() string {
	b.t.Helper()
	raw, err := os.ReadFile(filepath.Join(b.dir, "kafka", "ports"))
	if err != nil {
		b.t.Fatalf("testenv: the private broker's ports: %v", err)
	}
	f := strings.Fields(string(raw))
	if len(f) < 3 {
		b.t.Fatalf("testenv: the private broker's ports file holds %q, not PORT CPORT XPORT", raw)
	}
	return "127.0.0.1:" + f[2]
}

// LogFile returns the path of the broker's log, for test failure messages.
func (b *Broker) LogFile() string { return filepath.Join(b.dir, "kafka", "server.log") }

func (b *Broker) run(args ...string) error {
	_, err := b.output(args...)
	return err
}

func (b *Broker) output(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", append([]string{b.script}, args...)...)
	cmd.Env = append(append(os.Environ(), "STREAMLIMIT_RUN_DIR="+b.dir), b.env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("kafka.sh %s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	lines := strings.Fields(stdout.String())
	if len(lines) == 0 {
		return "", nil
	}
	return lines[len(lines)-1], nil
}

// kafkaScript finds e2e/services/kafka.sh by walking up from the working
// directory (a package directory under go test) to the module root, and
// checks that the tools it needs are installed.
func kafkaScript() (string, error) {
	for _, tool := range []string{"java", "kcat", "python3"} {
		if _, err := exec.LookPath(tool); err != nil {
			return "", fmt.Errorf("%s not installed", tool)
		}
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			p := filepath.Join(dir, "e2e", "services", "kafka.sh")
			if _, err := os.Stat(p); err != nil {
				return "", fmt.Errorf("module root %s has no e2e/services/kafka.sh", dir)
			}
			return p, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}

// ACLs runs Kafka's kafka-acls.sh (kafka.admin.AclCommand) with args, through kafka.sh
// (`kafka.sh acls ARGS...`), and returns its output and error.
func (b *Broker) ACLs(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", append([]string{b.script, "acls"}, args...)...)
	cmd.Env = append(append(os.Environ(), "STREAMLIMIT_RUN_DIR="+b.dir), b.env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// kafkaStartAttempts bounds the starts of one broker, each on ports chosen anew.
const kafkaStartAttempts = 4

// kafkaPortTaken is in the error of a `kafka.sh start` whose broker could not bind a port.
const kafkaPortTaken = "a port was taken"

// runKafkaStart runs `kafka.sh start` through run, at most attempts times, and returns the
// broker's address (the script's last line of output).
//
// A broker's ports are chosen before its JVM binds them, by kafka.sh for its own
// listeners and by the caller for those it passes in the environment: a JVM cannot be
// handed a bound socket. Anything on the machine may take such a port in between, so a
// start that fails to bind one is stopped (which forgets kafka.sh's ports and data) and
// retried, calling choose first, when not nil, for the caller to choose its ports again.
// Any other failure ends it at once.
func runKafkaStart(logf func(string, ...any), run func(args ...string) (string, error), choose func() error, attempts int) (string, error) {
	for attempt := 1; ; attempt++ {
		if choose != nil {
			if err := choose(); err != nil {
				return "", err
			}
		}
		addr, err := run("start")
		if err == nil {
			return addr, nil
		}
		if !strings.Contains(err.Error(), kafkaPortTaken) || attempt >= attempts {
			return "", err
		}
		logf("testenv: Kafka could not bind a port it was given (%d of %d); trying other ports", attempt, attempts)
		if _, err := run("stop"); err != nil {
			return "", fmt.Errorf("stopping Kafka after a failed start: %w", err)
		}
	}
}
