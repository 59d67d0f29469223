package testenv

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The multi-cluster harness: one single-node Kafka cluster per data center, started by
// e2e/services/kafka.sh, MirrorMaker 2 started by e2e/services/mm2.sh, and the links
// between data centers through proxies in the test process (link.go). It needs Java, Maven
// (for the first download of the jars), kcat and python3, as `make test` does.

// clusterHeap is each test cluster's JVM heap: several brokers share a small machine, and
// a test's topics hold little.
const clusterHeap = "256m"

// KafkaCluster is one data center's Kafka cluster, a single KRaft broker on loopback with
// two listeners: Addr for the data center's own clients, and a WAN listener that clients
// of other data centers reach through the proxy at WANAddr (the listener advertises
// WANAddr, so their metadata keeps them on the proxy).
type KafkaCluster struct {
	// Name is the data center's name, e.g. "eu".
	Name string
	// Addr is the bootstrap address for clients in the same data center.
	Addr string
	// WANAddr is where the WAN listener is advertised; a Link must listen there.
	WANAddr string
	// WANUpstream is the broker's WAN listener, the upstream of that Link.
	WANUpstream string
}

// RequireMultiDC ends the test when the multi-cluster harness cannot run: skipped under
// -short, and when java, mvn, kcat or python3 is missing (failed instead under CI=true, so
// that CI never passes by skipping).
func RequireMultiDC(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("testenv: the multi-cluster harness starts several Kafka brokers; skipped with -short")
	}
	var missing []string
	for _, cmd := range []string{"java", "mvn", "kcat", "python3"} {
		if _, err := exec.LookPath(cmd); err != nil {
			missing = append(missing, cmd)
		}
	}
	if len(missing) == 0 {
		return
	}
	msg := fmt.Sprintf("testenv: the multi-cluster harness needs %s on PATH (Kafka and MirrorMaker 2 run from Kafka's jars)",
		strings.Join(missing, ", "))
	Unavailable(t, "%s", msg)
}

// StartKafkaClusters starts one independent Kafka cluster per name, in parallel, in a run
// directory of the test's own, and stops them when the test ends.
func StartKafkaClusters(t testing.TB, names ...string) []*KafkaCluster {
	t.Helper()
	RequireMultiDC(t)
	root := t.TempDir()
	clusters := make([]*KafkaCluster, len(names))
	errs := make([]error, len(names))
	var wg sync.WaitGroup
	for i, name := range names {
		wanPort, proxyPort, err := freePortPair()
		if err != nil {
			t.Fatal(err)
		}
		c := &KafkaCluster{
			Name:        name,
			WANAddr:     "127.0.0.1:" + strconv.Itoa(proxyPort),
			WANUpstream: "127.0.0.1:" + strconv.Itoa(wanPort),
		}
		clusters[i] = c
		env := []string{
			"STREAMLIMIT_RUN_DIR=" + root,
			"STREAMLIMIT_KAFKA_INSTANCE=" + name,
			"STREAMLIMIT_KAFKA_HEAP=" + clusterHeap,
			"STREAMLIMIT_KAFKA_WAN_PORT=" + strconv.Itoa(wanPort),
			"STREAMLIMIT_KAFKA_WAN_ADVERTISE=" + c.WANAddr,
		}
		t.Cleanup(func() {
			// Stopped even when start failed halfway: a broker may be running.
			if _, err := runScript(context.Background(), "kafka.sh", env, "stop"); err != nil {
				t.Errorf("testenv: stopping Kafka %s: %v", name, err)
			}
		})
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			out, err := runScript(ctx, "kafka.sh", env, "start")
			if err != nil {
				errs[i] = fmt.Errorf("starting Kafka %s: %w", name, err)
				return
			}
			c.Addr = lastLine(out)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatalf("testenv: %v", err)
		}
	}
	return clusters
}

// MirrorOptions configures one MirrorMaker 2 process.
type MirrorOptions struct {
	// Config is the MirrorMaker properties file (the repository's deploy/mm2.properties,
	// which compose.yaml mounts too); RepoPath resolves a repository-relative path.
	Config string
	// Bootstrap replaces the file's <alias>.bootstrap.servers for each alias: the target
	// data center's own address, the others' WAN addresses. Every alias must be in the
	// file.
	Bootstrap map[string]string
	// Target is the cluster alias this process replicates into (MirrorMaker's
	// --clusters): one process per data center, consuming remotely and producing
	// locally, as MirrorMaker is usually deployed.
	Target string
}

// StartMirrorMaker starts MirrorMaker 2 in dedicated mode and stops it when the test
// ends. It returns once the JVM runs; replication is proven by sending a record across.
func StartMirrorMaker(t testing.TB, o MirrorOptions) {
	t.Helper()
	RequireMultiDC(t)
	src, err := os.ReadFile(o.Config)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	props, err := OverrideBootstrap(src, o.Bootstrap)
	if err != nil {
		t.Fatalf("testenv: %s: %v", o.Config, err)
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "mm2-"+o.Target+".properties")
	if err := os.WriteFile(file, props, 0o644); err != nil {
		t.Fatal(err)
	}
	env := []string{"STREAMLIMIT_RUN_DIR=" + dir, "STREAMLIMIT_MM2_INSTANCE=mm2-" + o.Target}
	t.Cleanup(func() {
		if t.Failed() {
			logProblems(t, filepath.Join(dir, "mm2-"+o.Target, "mm2.log"), 40)
		}
		if _, err := runScript(context.Background(), "mm2.sh", env, "stop"); err != nil {
			t.Errorf("testenv: stopping MirrorMaker into %s: %v", o.Target, err)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if _, err := runScript(ctx, "mm2.sh", env, "start", file, "--clusters", o.Target); err != nil {
		t.Fatalf("testenv: starting MirrorMaker into %s: %v", o.Target, err)
	}
}

var bootstrapLine = regexp.MustCompile(`^\s*([A-Za-z0-9_-]+)\.bootstrap\.servers\s*[=:]`)

// OverrideBootstrap returns the properties file src with the value of each
// <alias>.bootstrap.servers replaced by addrs[alias]. An alias of addrs that the file does
// not configure is an error, so that a renamed data center fails loudly.
func OverrideBootstrap(src []byte, addrs map[string]string) ([]byte, error) {
	seen := map[string]bool{}
	var out bytes.Buffer
	sc := bufio.NewScanner(bytes.NewReader(src))
	for sc.Scan() {
		line := sc.Text()
		if m := bootstrapLine.FindStringSubmatch(line); m != nil {
			if addr, ok := addrs[m[1]]; ok {
				line = m[1] + ".bootstrap.servers = " + addr
				seen[m[1]] = true
			}
		}
		out.WriteString(line)
		out.WriteByte('\n')
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading properties: %w", err)
	}
	for alias := range addrs {
		if !seen[alias] {
			return nil, fmt.Errorf("no %s.bootstrap.servers line to override", alias)
		}
	}
	return out.Bytes(), nil
}

// RepoPath returns the absolute path of a file of the repository, given relative to its
// root (the directory of go.mod above the test's working directory).
func RepoPath(t testing.TB, rel string) string {
	t.Helper()
	root, err := repoRoot()
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return filepath.Join(root, rel)
}

func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("working directory: %w", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod above the working directory")
		}
		dir = parent
	}
}

// runScript runs e2e/services/<name> with args and env added to the environment, and
// returns its standard output; on failure the error carries its standard error.
func runScript(ctx context.Context, name string, env []string, args ...string) (string, error) {
	root, err := repoRoot()
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, "bash", append([]string{filepath.Join(root, "e2e", "services", name)}, args...)...)
	// The services outlive this command; they are stopped with the test binary too when
	// it dies without running its cleanup (watch_owner in e2e/services/lib.sh).
	cmd.Env = append(append(os.Environ(), "STREAMLIMIT_OWNER_PID="+strconv.Itoa(os.Getpid())), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// freePortPair returns two distinct loopback ports that were free a moment ago.
func freePortPair() (int, int, error) {
	a, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, 0, fmt.Errorf("free port: %w", err)
	}
	defer a.Close()
	b, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, 0, fmt.Errorf("free port: %w", err)
	}
	defer b.Close()
	return a.Addr().(*net.TCPAddr).Port, b.Addr().(*net.TCPAddr).Port, nil
}

// logProblems logs the last n warnings and errors of a log4j log: what explains a failure,
// without the thousands of lines MirrorMaker logs at INFO.
func logProblems(t testing.TB, path string, n int) {
	b, err := os.ReadFile(path)
	if err != nil {
		return
	}
	var lines []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, "] WARN ") || strings.Contains(l, "] ERROR ") {
			lines = append(lines, l)
		}
	}
	t.Logf("last warnings and errors of %s:\n%s", path, strings.Join(lines[max(0, len(lines)-n):], "\n"))
}
