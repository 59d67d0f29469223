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
	"slices"
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

// clusterJVMOpts are the test clusters' extra JVM options. A test cluster lives a few
// minutes, most of which the JIT's optimizing compiler would spend compiling, and beside
// other brokers and MirrorMakers on two cores: the client compiler alone and the serial
// collector (the heap is small) leave the machine's CPU to the pipeline under test.
const clusterJVMOpts = "-XX:TieredStopAtLevel=1 -XX:-UseG1GC -XX:+UseSerialGC"

// KafkaCluster is one data center's Kafka cluster, a single KRaft broker on loopback with
// a listener for the data center's own clients (Addr) and one WAN listener per other data
// center, whose clients reach the broker through a Link that the broker advertises as the
// listener's address: the metadata they get back keeps them on the link. One listener
// and link per pair of data centers lets a test cut the link between two of them while
// both still reach a third.
type KafkaCluster struct {
	// Name is the data center's name, e.g. "eu".
	Name string
	// Addr is the bootstrap address for clients in the same data center.
	Addr string
	// WAN holds, for the name of each other data center, the link its clients reach this
	// cluster through: their bootstrap address is its Addr.
	WAN map[string]*Link
}

// RequireMultiDC ends the test when the multi-cluster harness cannot run: skipped under
// -short, and when java, mvn, kcat or python3 is missing (failed instead under CI=true, so
// that CI never passes by skipping).
func RequireMultiDC(t testing.TB) {
	t.Helper()
	RealParts(t)
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
// directory of the test's own, each with a WAN listener and its Link for every other
// name, and stops them when the test ends.
//
// Each link is bound before its broker starts, and the broker advertises the address
// bound, so that no other process can take it in between. The broker's own WAN
// listeners are bound by its JVM, on ports chosen just before: a start that finds one
// taken is retried on others (runKafkaStart), the links following.
func StartKafkaClusters(t testing.TB, names ...string) []*KafkaCluster {
	t.Helper()
	RequireMultiDC(t)
	root := t.TempDir()
	clusters := make([]*KafkaCluster, len(names))
	errs := make([]error, len(names))
	var wg sync.WaitGroup
	for i, name := range names {
		c := &KafkaCluster{Name: name, WAN: map[string]*Link{}}
		var links []*Link
		var advertised []string
		for _, peer := range names {
			if peer != name {
				l := NewLink(t, peer+"->"+name, "")
				c.WAN[peer] = l
				links = append(links, l)
				advertised = append(advertised, l.Addr())
			}
		}
		clusters[i] = c
		env := []string{
			"STREAMLIMIT_RUN_DIR=" + root,
			"STREAMLIMIT_KAFKA_INSTANCE=" + name,
			"STREAMLIMIT_KAFKA_HEAP=" + clusterHeap,
			"STREAMLIMIT_KAFKA_JVM_OPTS=" + clusterJVMOpts,
		}
		t.Cleanup(func() {
			// Stopped even when start failed halfway: a broker may be running.
			if _, err := runScript(context.Background(), "kafka.sh", env, "stop"); err != nil {
				t.Errorf("testenv: stopping Kafka %s: %v", name, err)
			}
		})
		var wanEnv []string // this attempt's WAN listeners
		choose := func() error {
			wanEnv = nil
			if len(links) == 0 {
				return nil
			}
			// Probed, not held: the broker's JVM binds them (see runKafkaStart).
			ports, err := freePorts(len(links))
			if err != nil {
				return err
			}
			wanPorts := make([]string, len(ports))
			for j, p := range ports {
				wanPorts[j] = strconv.Itoa(p)
				links[j].SetUpstream("127.0.0.1:" + wanPorts[j])
			}
			wanEnv = []string{"STREAMLIMIT_KAFKA_WAN_PORT=" + strings.Join(wanPorts, ","),
				"STREAMLIMIT_KAFKA_WAN_ADVERTISE=" + strings.Join(advertised, ",")}
			return nil
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			run := func(args ...string) (string, error) {
				out, err := runScript(ctx, "kafka.sh", append(slices.Clip(env), wanEnv...), args...)
				return lastLine(out), err
			}
			addr, err := runKafkaStart(t.Logf, run, choose, kafkaStartAttempts)
			if err != nil {
				errs[i] = fmt.Errorf("starting Kafka %s: %w", name, err)
				return
			}
			c.Addr = addr
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
	// Clusters, when set, are the data centers to replicate between: the file is run in
	// the form MirrorConfigFor gives it for them. Empty: the file's own clusters.
	Clusters []string
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
	if len(o.Clusters) > 0 {
		if src, err = MirrorConfigFor(src, o.Clusters); err != nil {
			t.Fatalf("testenv: %s: %v", o.Config, err)
		}
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

var (
	clustersLine = regexp.MustCompile(`^\s*clusters\s*[=:]`)
	flowLine     = regexp.MustCompile(`^\s*([A-Za-z0-9_-]+)->([A-Za-z0-9_-]+)\.([^=:\s]+)\s*[=:]\s*(.*?)\s*$`)
)

// MirrorConfigFor returns the MirrorMaker properties file src for the clusters named: its
// clusters line lists them, every ordered pair of them gets the flow settings the file
// gives its own flows (which must all be alike, e.g. eu->us and us->eu both enabled for
// topics hits), and each cluster the file does not configure gets a bootstrap.servers line
// copied from its first cluster's with the alias replaced (kafka-eu:9092 becomes
// kafka-ap:9092), to be overridden like the others. Everything else is kept as it is. So
// deploy/mm2.properties, whose two data centers compose.yaml runs, also describes any
// number of them.
func MirrorConfigFor(src []byte, clusters []string) ([]byte, error) {
	if len(clusters) < 2 {
		return nil, fmt.Errorf("MirrorMaker needs at least two clusters, got %v", clusters)
	}
	type prop struct{ name, value string }
	var (
		lines     []string
		flowAt    = -1 // where the flows go: the file's first flow line
		bootAt    = -1 // after the file's last bootstrap line
		firstFlow string
		props     []prop                           // the first flow's settings, in order
		flows     = map[string]map[string]string{} // flow → its settings
		firstBoot [2]string                        // alias, value
		haveBoot  = map[string]bool{}
		listed    = map[string]bool{}
	)
	for _, c := range clusters {
		listed[c] = true
	}
	sc := bufio.NewScanner(bytes.NewReader(src))
	for sc.Scan() {
		line := sc.Text()
		if m := flowLine.FindStringSubmatch(line); m != nil {
			flow := m[1] + "->" + m[2]
			if firstFlow == "" {
				firstFlow, flowAt = flow, len(lines)
			}
			if flows[flow] == nil {
				flows[flow] = map[string]string{}
			}
			flows[flow][m[3]] = m[4]
			if flow == firstFlow {
				props = append(props, prop{m[3], m[4]})
			}
			continue
		}
		if m := bootstrapLine.FindStringSubmatch(line); m != nil {
			if firstBoot[0] == "" {
				firstBoot = [2]string{m[1], strings.TrimSpace(line[len(m[0]):])}
			}
			if !listed[m[1]] {
				continue // a cluster not replicated here
			}
			haveBoot[m[1]] = true
			lines = append(lines, line)
			bootAt = len(lines)
			continue
		}
		if clustersLine.MatchString(line) {
			line = "clusters = " + strings.Join(clusters, ", ")
		}
		lines = append(lines, line)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading properties: %w", err)
	}
	if firstFlow == "" {
		return nil, fmt.Errorf("no flow (<source>-><target>.<setting>) to generalise")
	}
	if firstBoot[0] == "" {
		return nil, fmt.Errorf("no <alias>.bootstrap.servers line")
	}
	for flow, set := range flows {
		if len(set) != len(props) {
			return nil, fmt.Errorf("flows %s and %s have different settings: cannot generalise them", firstFlow, flow)
		}
		for _, p := range props {
			if v, ok := set[p.name]; !ok || v != p.value {
				return nil, fmt.Errorf("%s.%s differs from %s's (%q): cannot generalise the flows", flow, p.name, firstFlow, p.value)
			}
		}
	}
	var gen []string
	for _, a := range clusters {
		for _, b := range clusters {
			if a == b {
				continue
			}
			for _, p := range props {
				gen = append(gen, fmt.Sprintf("%s->%s.%s = %s", a, b, p.name, p.value))
			}
		}
	}
	var boots []string
	for _, c := range clusters {
		if !haveBoot[c] {
			boots = append(boots, c+".bootstrap.servers = "+strings.ReplaceAll(firstBoot[1], firstBoot[0], c))
		}
	}
	if bootAt < 0 {
		bootAt = min(flowAt, len(lines))
	}
	// Insert the flows first when they come after the bootstrap lines, so that the
	// bootstrap position stays right.
	insert := func(at int, add []string) { lines = append(lines[:at], append(add, lines[at:]...)...) }
	if flowAt >= bootAt {
		insert(flowAt, gen)
		insert(bootAt, boots)
	} else {
		insert(bootAt, boots)
		insert(flowAt, gen)
	}
	return []byte(strings.Join(lines, "\n") + "\n"), nil
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

// freePorts returns n distinct loopback ports that were free a moment ago, for a process
// that binds them itself and cannot be handed a bound socket (a JVM); its start must be
// retried on others when one was taken in between.
func freePorts(n int) ([]int, error) {
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("free port: %w", err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
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
