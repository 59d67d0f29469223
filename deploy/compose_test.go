// Package deploy_test checks the two-data-center compose stack (compose.yaml at the
// repository root, and the files it mounts from deploy/) without Docker: what `docker
// compose up` would only reveal at run time — a flag the CLI does not have, a mounted file
// that is missing, a port published twice, MirrorMaker copying the wrong topics, an
// enforcer whose site is not its data center — fails here instead.
package deploy_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/streamlimit/streamlimit/enforcer"
	"github.com/streamlimit/streamlimit/enforcer/rules"
	"github.com/streamlimit/streamlimit/internal/testenv"
	"github.com/streamlimit/streamlimit/serve/httplimit"
	"github.com/streamlimit/streamlimit/topics"
)

// repoRoot is where compose.yaml lives, relative to this package's directory.
const repoRoot = ".."

// Service names follow one pattern per data center, e.g. kafka-eu, enforcer-us.
func svc(role, dc string) string { return role + "-" + dc }

// The stack's conventions, which the files and docs/operations.md state.
const (
	kafkaInternalPort = "9092"
	redisPort         = "6379"
	mm2Service        = "mm2"
	mm2Properties     = "/etc/mm2/mm2.properties"
	loadgenService    = "loadgen"
)

// composeFile is the part of the Compose specification that compose.yaml uses. Decoding
// with KnownFields makes a misspelt key (depend_on, healthckeck) an error, where Compose
// would reject the file at `up`.
type composeFile struct {
	Name     string             `yaml:"name"`
	Services map[string]service `yaml:"services"`
	// Extensions are the top-level x- keys holding YAML anchors.
	Extensions map[string]any `yaml:",inline"`
}

type service struct {
	Image       string                `yaml:"image"`
	Build       *build                `yaml:"build"`
	Restart     string                `yaml:"restart"`
	Entrypoint  []string              `yaml:"entrypoint"`
	Command     []string              `yaml:"command"`
	Environment map[string]string     `yaml:"environment"`
	Ports       []string              `yaml:"ports"`
	Volumes     []string              `yaml:"volumes"`
	DependsOn   map[string]dependency `yaml:"depends_on"`
	Healthcheck *healthcheck          `yaml:"healthcheck"`
}

type build struct {
	Context    string `yaml:"context"`
	Dockerfile string `yaml:"dockerfile"`
}

type dependency struct {
	Condition string `yaml:"condition"`
}

type healthcheck struct {
	Test        []string `yaml:"test"`
	Interval    string   `yaml:"interval"`
	Timeout     string   `yaml:"timeout"`
	Retries     int      `yaml:"retries"`
	StartPeriod string   `yaml:"start_period"`
}

func loadCompose(t *testing.T) *composeFile {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot, "compose.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	// Compose interpolates $VAR and ${VAR} in the whole file; this stack uses no variables,
	// so any $ would be a mistake (a shell or regexp $ must be written $$).
	for i, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue // comments are not interpolated
		}
		if strings.Contains(strings.ReplaceAll(line, "$$", ""), "$") {
			t.Errorf("compose.yaml:%d: unescaped $ would be interpolated by Compose: %s", i+1, line)
		}
	}
	var c composeFile
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil {
		t.Fatalf("compose.yaml: %v", err)
	}
	for k := range c.Extensions {
		if !strings.HasPrefix(k, "x-") {
			t.Errorf("compose.yaml: unknown top-level key %q", k)
		}
	}
	if len(c.Services) == 0 {
		t.Fatal("compose.yaml: no services")
	}
	return &c
}

// mm2Config is a parsed Java properties file (the subset MirrorMaker's file uses: one
// key = value or key: value per line, # and ! comments).
type mm2Config map[string]string

func loadProperties(t *testing.T, file string) mm2Config {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	props := mm2Config{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' || line[0] == '!' {
			continue
		}
		if strings.HasSuffix(line, `\`) {
			t.Fatalf("%s:%d: continued lines are not supported by this test", file, n)
		}
		i := strings.IndexAny(line, "=:")
		if i < 0 {
			t.Fatalf("%s:%d: no = in %q", file, n, line)
		}
		k, v := strings.TrimSpace(line[:i]), strings.TrimSpace(line[i+1:])
		if _, dup := props[k]; dup {
			t.Errorf("%s:%d: %s set twice", file, n, k)
		}
		props[k] = v
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return props
}

// get returns the value of key for the replication flow src->dst, or for cluster src, as
// MirrorMaker resolves it: the most specific prefix wins, then the top-level key.
func (p mm2Config) get(src, dst, key string) (string, bool) {
	for _, k := range []string{src + "->" + dst + "." + key, key} {
		if v, ok := p[k]; ok {
			return v, true
		}
	}
	return "", false
}

func list(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// stack is compose.yaml with its data centers (MirrorMaker's cluster aliases) and
// MirrorMaker's configuration.
type stack struct {
	compose *composeFile
	dcs     []string
	mm2     mm2Config
}

func loadStack(t *testing.T) *stack {
	t.Helper()
	c := loadCompose(t)
	mm, ok := c.Services[mm2Service]
	if !ok {
		t.Fatalf("compose.yaml: no %s service", mm2Service)
	}
	host := hostPath(t, mm, mm2Properties)
	props := loadProperties(t, host)
	dcs := list(props["clusters"])
	if len(dcs) < 2 {
		t.Fatalf("%s: clusters = %q, want at least two data centers", host, props["clusters"])
	}
	return &stack{compose: c, dcs: dcs, mm2: props}
}

func (s *stack) service(t *testing.T, name string) service {
	t.Helper()
	sv, ok := s.compose.Services[name]
	if !ok {
		t.Fatalf("compose.yaml: no service %s", name)
	}
	return sv
}

// hostPath maps a path inside service sv's container to the repository file mounted
// there, failing when no bind mount covers it or the file does not exist.
func hostPath(t *testing.T, sv service, container string) string {
	t.Helper()
	for _, v := range sv.Volumes {
		src, dst, ok := parseBind(v)
		if !ok {
			continue
		}
		if container == dst || strings.HasPrefix(container, dst+"/") {
			p := filepath.Join(repoRoot, src, strings.TrimPrefix(container, dst))
			if _, err := os.Stat(p); err != nil {
				t.Fatalf("%s (mounted at %s): %v", p, container, err)
			}
			return p
		}
	}
	t.Fatalf("no volume of the service mounts %s (volumes %q)", container, sv.Volumes)
	return ""
}

// parseBind splits a short-syntax bind mount "./src:/dst[:ro]".
func parseBind(v string) (src, dst string, ok bool) {
	parts := strings.Split(v, ":")
	if len(parts) < 2 || !(strings.HasPrefix(parts[0], ".") || strings.HasPrefix(parts[0], "/")) {
		return "", "", false
	}
	return parts[0], path.Clean(parts[1]), true
}

// args holds a streamlimit command line: the subcommand path and --flag=value flags.
type args struct {
	sub   []string
	flags map[string]string
	order []string
}

// streamlimitArgs parses the command of a service that runs the streamlimit image. Flags
// must be written --name=value (or --name alone for a boolean), so that the test needs no
// knowledge of which flags take values.
func streamlimitArgs(t *testing.T, name string, sv service) args {
	t.Helper()
	a := args{flags: map[string]string{}}
	for _, w := range sv.Command {
		if !strings.HasPrefix(w, "-") {
			if len(a.flags) > 0 {
				t.Errorf("%s: argument %q after flags: write flags as --name=value", name, w)
			}
			a.sub = append(a.sub, w)
			continue
		}
		if !strings.HasPrefix(w, "--") {
			t.Errorf("%s: %q: write flags in the long form --name=value", name, w)
			continue
		}
		k, v, _ := strings.Cut(strings.TrimPrefix(w, "--"), "=")
		if _, dup := a.flags[k]; dup {
			t.Errorf("%s: --%s given twice", name, k)
		}
		a.flags[k] = v
		a.order = append(a.order, k)
	}
	if len(a.sub) == 0 {
		t.Errorf("%s: no streamlimit subcommand in command %q", name, sv.Command)
	}
	return a
}

// streamlimitServices returns the services that run the streamlimit image, i.e. those
// built from the repository.
func (s *stack) streamlimitServices() map[string]service {
	out := map[string]service{}
	for name, sv := range s.compose.Services {
		if sv.Build != nil {
			out[name] = sv
		}
	}
	return out
}

// cli builds cmd/streamlimit once and answers `streamlimit <sub> --help`.
type cli struct {
	bin string
}

func (c *cli) help(t *testing.T, sub []string) (usage string, flags map[string]bool) {
	t.Helper()
	if c.bin == "" {
		testenv.RealParts(t) // builds and runs the binary
		goTool, err := exec.LookPath("go")
		if err != nil {
			t.Fatalf("the go tool is needed to build cmd/streamlimit: %v", err)
		}
		bin := filepath.Join(t.TempDir(), "streamlimit")
		cmd := exec.Command(goTool, "build", "-o", bin, "./cmd/streamlimit")
		cmd.Dir = repoRoot
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build ./cmd/streamlimit: %v\n%s", err, out)
		}
		c.bin = bin
	}
	out, err := exec.Command(c.bin, append(slices.Clone(sub), "--help")...).CombinedOutput()
	if err != nil {
		t.Fatalf("streamlimit %s --help: %v\n%s", strings.Join(sub, " "), err, out)
	}
	flags = map[string]bool{}
	flagLine := regexp.MustCompile(`^\s+(?:-\w, )?--([a-z0-9][a-z0-9-]*)`)
	var inFlags bool
	for _, line := range strings.Split(string(out), "\n") {
		switch {
		case strings.HasSuffix(line, "Flags:"):
			inFlags = true
		case inFlags && line == "":
			inFlags = false
		case inFlags:
			if m := flagLine.FindStringSubmatch(line); m != nil {
				flags[m[1]] = true
			}
		}
	}
	return string(out), flags
}

func TestServicesHaveImageOrBuild(t *testing.T) {
	s := loadStack(t)
	tagged := regexp.MustCompile(`^[a-z0-9./_-]+:[A-Za-z0-9._-]+$`)
	for name, sv := range s.compose.Services {
		if sv.Image == "" && sv.Build == nil {
			t.Errorf("%s: neither image nor build", name)
		}
		if sv.Build != nil {
			df := sv.Build.Dockerfile
			if df == "" {
				df = "Dockerfile"
			}
			p := filepath.Join(repoRoot, sv.Build.Context, df)
			if _, err := os.Stat(p); err != nil {
				t.Errorf("%s: build: %v", name, err)
			}
			continue
		}
		if !tagged.MatchString(sv.Image) || strings.HasSuffix(sv.Image, ":latest") {
			t.Errorf("%s: image %q: want a pinned tag (not latest)", name, sv.Image)
		}
	}
	if len(s.streamlimitServices()) == 0 {
		t.Fatal("no service builds the streamlimit image")
	}
}

func TestDockerfile(t *testing.T) {
	s := loadStack(t)
	seen := map[string]bool{}
	for name, sv := range s.streamlimitServices() {
		p := filepath.Join(repoRoot, sv.Build.Context, "Dockerfile")
		if sv.Build.Dockerfile != "" {
			p = filepath.Join(repoRoot, sv.Build.Context, sv.Build.Dockerfile)
		}
		if seen[p] {
			continue
		}
		seen[p] = true
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		df := string(data)
		var froms []string
		for _, line := range strings.Split(df, "\n") {
			if f := strings.Fields(line); len(f) >= 2 && strings.EqualFold(f[0], "FROM") {
				froms = append(froms, f[1])
			}
		}
		if len(froms) < 2 || !strings.HasPrefix(froms[0], "golang:") {
			t.Errorf("%s: stages %q: want a multi-stage build from golang:", p, froms)
		}
		if last := froms[len(froms)-1]; !strings.HasPrefix(last, "gcr.io/distroless/static") && last != "scratch" {
			t.Errorf("%s: final stage %q: want a static base (distroless/static or scratch)", p, last)
		}
		for _, want := range []string{
			"CGO_ENABLED=0", "-trimpath", "-X main.version=", "./cmd/streamlimit",
			`ENTRYPOINT ["/streamlimit"]`,
		} {
			if !strings.Contains(df, want) {
				t.Errorf("%s: missing %q", p, want)
			}
		}
		if m := regexp.MustCompile(`(?m)^USER\s+(\S+)`).FindAllStringSubmatch(df, -1); len(m) == 0 || strings.HasPrefix(m[len(m)-1][1], "0") || strings.HasPrefix(m[len(m)-1][1], "root") {
			t.Errorf("%s: the final stage must run as a non-root USER", p)
		}
		// -X main.version only works if package main has that variable.
		src, err := os.ReadFile(filepath.Join(repoRoot, "cmd", "streamlimit", "root.go"))
		if err != nil || !regexp.MustCompile(`(?m)^var version\b`).Match(src) {
			t.Errorf("cmd/streamlimit: no package-level var version for -X main.version (%v)", err)
		}
	}
	// The build context must keep what the build needs.
	ignore, err := os.ReadFile(filepath.Join(repoRoot, ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	for _, pat := range strings.Split(string(ignore), "\n") {
		pat = strings.TrimPrefix(strings.TrimSpace(pat), "/")
		if pat == "" || pat[0] == '#' || pat[0] == '!' {
			continue
		}
		for _, need := range []string{"go.mod", "go.sum", "cmd", "cmd/streamlimit", "cmd/streamlimit/main.go", "enforcer", "aggregator", "topics", "producer", "internal"} {
			if ok, _ := filepath.Match(pat, need); ok {
				t.Errorf(".dockerignore: %q excludes %s, which the build needs", pat, need)
			}
		}
	}
}

func TestStreamlimitCommandsAndFlagsExist(t *testing.T) {
	s := loadStack(t)
	var c cli // builds cmd/streamlimit on first use
	for name, sv := range s.streamlimitServices() {
		if len(sv.Entrypoint) > 0 {
			t.Errorf("%s: overrides the image's entrypoint /streamlimit", name)
		}
		a := streamlimitArgs(t, name, sv)
		usage, flags := c.help(t, a.sub)
		// Cobra answers `streamlimit topics nosuch --help` with the help of `topics`: make
		// sure the whole subcommand path was found.
		if want := "streamlimit " + strings.Join(a.sub, " ") + " [flags]"; !strings.Contains(usage, want) {
			t.Errorf("%s: streamlimit %s is not a command (its help has no %q)", name, strings.Join(a.sub, " "), want)
			continue
		}
		for _, f := range a.order {
			if !flags[f] {
				t.Errorf("%s: streamlimit %s has no flag --%s", name, strings.Join(a.sub, " "), f)
			}
		}
	}
}

// hostPort is one published port.
type hostPort struct {
	ip, port, target string
}

func parsePort(t *testing.T, svc, p string) hostPort {
	t.Helper()
	p, _, _ = strings.Cut(p, "/") // protocol
	f := strings.Split(p, ":")
	switch len(f) {
	case 2:
		return hostPort{ip: "0.0.0.0", port: f[0], target: f[1]}
	case 3:
		return hostPort{ip: f[0], port: f[1], target: f[2]}
	}
	t.Errorf("%s: port %q: want [IP:]HOST:CONTAINER", svc, p)
	return hostPort{}
}

func TestHostPortsDoNotClash(t *testing.T) {
	s := loadStack(t)
	owner := map[string]string{}
	for name, sv := range s.compose.Services {
		for _, p := range sv.Ports {
			hp := parsePort(t, name, p)
			if _, err := strconv.ParseUint(hp.port, 10, 16); err != nil {
				t.Errorf("%s: port %q: host port must be one number, not a range or random", name, p)
			}
			if hp.ip != "127.0.0.1" {
				t.Errorf("%s: port %q is published on %s; the stack publishes on 127.0.0.1 only", name, p, hp.ip)
			}
			if prev, dup := owner[hp.port]; dup {
				t.Errorf("host port %s published by both %s and %s", hp.port, prev, name)
			}
			owner[hp.port] = name
		}
	}
}

func TestMountedFilesExist(t *testing.T) {
	s := loadStack(t)
	for name, sv := range s.compose.Services {
		for _, v := range sv.Volumes {
			src, _, ok := parseBind(v)
			if !ok {
				t.Errorf("%s: volume %q: this stack only bind-mounts repository files", name, v)
				continue
			}
			if filepath.IsAbs(src) {
				t.Errorf("%s: volume %q: use a path relative to the repository", name, v)
				continue
			}
			if _, err := os.Stat(filepath.Join(repoRoot, src)); err != nil {
				t.Errorf("%s: volume %q: %v", name, v, err)
			}
		}
	}
}

// kafkaListeners returns the host:port addresses Kafka service name advertises, by
// listener name.
func kafkaListeners(t *testing.T, name string, sv service) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, l := range list(sv.Environment["KAFKA_ADVERTISED_LISTENERS"]) {
		ln, addr, ok := strings.Cut(l, "://")
		if !ok {
			t.Fatalf("%s: KAFKA_ADVERTISED_LISTENERS: bad listener %q", name, l)
		}
		out[ln] = addr
	}
	return out
}

func TestKafkaPerDataCenter(t *testing.T) {
	s := loadStack(t)
	for _, dc := range s.dcs {
		name := svc("kafka", dc)
		sv := s.service(t, name)
		if !strings.HasPrefix(sv.Image, "apache/kafka:") {
			t.Errorf("%s: image %q: want the official apache/kafka image", name, sv.Image)
		}
		env := sv.Environment
		if roles := list(env["KAFKA_PROCESS_ROLES"]); !slices.Contains(roles, "broker") || !slices.Contains(roles, "controller") {
			t.Errorf("%s: KAFKA_PROCESS_ROLES = %q: want a combined KRaft node (broker,controller)", name, env["KAFKA_PROCESS_ROLES"])
		}
		// On one broker, internal topics with the default replication factor 3 cannot
		// be created: consumer groups (the aggregator) would never work.
		for _, k := range []string{"KAFKA_NODE_ID", "KAFKA_CONTROLLER_QUORUM_VOTERS", "KAFKA_CONTROLLER_LISTENER_NAMES", "KAFKA_LISTENERS", "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"} {
			if env[k] == "" {
				t.Errorf("%s: %s not set (the image ignores its default config once any KAFKA_ variable is set)", name, k)
			}
		}
		for _, k := range []string{"KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR", "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR", "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR"} {
			if env[k] != "1" {
				t.Errorf("%s: %s = %q, want 1 on a single broker", name, k, env[k])
			}
		}
		// Every advertised listener must be a listener; the one for containers must be
		// the service name, the one for the host must be published on the same port.
		listeners := map[string]string{}
		for _, l := range list(env["KAFKA_LISTENERS"]) {
			ln, addr, _ := strings.Cut(l, "://")
			listeners[ln] = addr
		}
		adv := kafkaListeners(t, name, sv)
		var internal, host bool
		for ln, addr := range adv {
			h, p, err := net.SplitHostPort(addr)
			if err != nil {
				t.Errorf("%s: advertised %s://%s: %v", name, ln, addr, err)
				continue
			}
			la, ok := listeners[ln]
			if !ok {
				t.Errorf("%s: advertised listener %s is not in KAFKA_LISTENERS", name, ln)
			} else if _, lp, _ := net.SplitHostPort(la); lp != p {
				t.Errorf("%s: listener %s listens on %s but advertises port %s", name, ln, la, p)
			}
			switch h {
			case name:
				internal = p == kafkaInternalPort
			case "localhost", "127.0.0.1":
				host = true
				published := false
				for _, pp := range sv.Ports {
					hp := parsePort(t, name, pp)
					published = published || (hp.port == p && hp.target == p)
				}
				if !published {
					t.Errorf("%s: advertises %s for the host but does not publish %s:%s", name, addr, p, p)
				}
			default:
				t.Errorf("%s: advertised %s://%s: want %s or localhost", name, ln, addr, name)
			}
		}
		if !internal {
			t.Errorf("%s: no listener advertised as %s:%s for the other containers", name, name, kafkaInternalPort)
		}
		if !host {
			t.Errorf("%s: no listener advertised on localhost for tools on the host", name)
		}
		if sv.Healthcheck == nil || len(sv.Healthcheck.Test) == 0 {
			t.Errorf("%s: no healthcheck (services wait for service_healthy)", name)
		}
	}
}

// checkBrokers checks that a --brokers value names data center dc's Kafka as advertised.
func (s *stack) checkBrokers(t *testing.T, who, value, dc string) {
	t.Helper()
	kafka := svc("kafka", dc)
	want := kafka + ":" + kafkaInternalPort
	if value != want {
		t.Errorf("%s: brokers %q, want %q (its own data center's Kafka)", who, value, want)
	}
	found := false
	for _, addr := range kafkaListeners(t, kafka, s.service(t, kafka)) {
		found = found || addr == value
	}
	if !found {
		t.Errorf("%s: brokers %q is not an address %s advertises", who, value, kafka)
	}
}

func TestMirrorMakerReplicatesHitsBothWays(t *testing.T) {
	s := loadStack(t)
	mm := s.service(t, mm2Service)
	if !strings.HasPrefix(mm.Image, "apache/kafka:") {
		t.Errorf("%s: image %q: want apache/kafka", mm2Service, mm.Image)
	}
	if cmd := append(slices.Clone(mm.Entrypoint), mm.Command...); !slices.Equal(cmd, []string{"/opt/kafka/bin/connect-mirror-maker.sh", mm2Properties}) {
		t.Errorf("%s: runs %q, want connect-mirror-maker.sh %s", mm2Service, cmd, mm2Properties)
	}
	p := s.mm2
	if pol, ok := p["replication.policy.class"]; ok && !strings.HasSuffix(pol, ".DefaultReplicationPolicy") {
		t.Errorf("replication.policy.class = %s: the aggregators expect DefaultReplicationPolicy's <alias>.<topic>", pol)
	}
	sep := "."
	if v, ok := p["replication.policy.separator"]; ok {
		sep = v
	}
	if sep != "." {
		t.Errorf("replication.policy.separator = %q, want . (topics.HitsPattern expects <dc>.hits)", sep)
	}
	for _, k := range []string{
		"replication.factor", "checkpoints.topic.replication.factor", "heartbeats.topic.replication.factor",
		"offset-syncs.topic.replication.factor", "offset.storage.replication.factor",
		"status.storage.replication.factor", "config.storage.replication.factor",
	} {
		if p[k] != "1" {
			t.Errorf("mm2.properties: %s = %q, want 1 on single-broker clusters", k, p[k])
		}
	}
	if p["sync.topic.configs.enabled"] != "true" {
		t.Errorf("mm2.properties: sync.topic.configs.enabled = %q, want true", p["sync.topic.configs.enabled"])
	}
	for _, dc := range s.dcs {
		s.checkBrokers(t, "mm2.properties "+dc+".bootstrap.servers", p[dc+".bootstrap.servers"], dc)
		if d, ok := mm.DependsOn[svc("kafka", dc)]; !ok || d.Condition != "service_healthy" {
			t.Errorf("%s: must depend on %s being healthy", mm2Service, svc("kafka", dc))
		}
		if d, ok := mm.DependsOn[svc("topics", dc)]; !ok || d.Condition != "service_completed_successfully" {
			t.Errorf("%s: must start after %s completed, so that hits exists with its partition count", mm2Service, svc("topics", dc))
		}
	}
	for _, src := range s.dcs {
		for _, dst := range s.dcs {
			if src == dst {
				continue
			}
			flow := src + "->" + dst
			if v, _ := p.get(src, dst, "enabled"); v != "true" {
				t.Errorf("mm2.properties: %s.enabled = %q, want true", flow, v)
			}
			pat, ok := p.get(src, dst, "topics")
			if !ok {
				t.Errorf("mm2.properties: no topics for %s (the default .* would copy counts too)", flow)
				continue
			}
			// MirrorMaker's topic filter: a comma-separated list of regular expressions,
			// each matched against the whole topic name.
			matches := func(topic string) bool {
				for _, re := range list(pat) {
					if regexp.MustCompile(`^(?:` + re + `)$`).MatchString(topic) {
						return true
					}
				}
				return false
			}
			hitsTopic := s.hitsTopic(t, src)
			if !matches(hitsTopic) {
				t.Errorf("mm2.properties: %s.topics = %q does not copy %s", flow, pat, hitsTopic)
			}
			for _, no := range []string{topics.DefaultCountsTopic, dst + sep + hitsTopic} {
				if matches(no) {
					t.Errorf("mm2.properties: %s.topics = %q copies %s, which must stay local", flow, pat, no)
				}
			}
			// The copy arrives in dst as <src>.hits: dst's aggregator must consume it.
			remote := src + sep + hitsTopic
			agg := svc("aggregator", dst)
			re := s.aggregatorPattern(t, dst)
			if !re.MatchString(remote) {
				t.Errorf("%s: topic pattern %s does not match %s, MirrorMaker's copy of %s's hits", agg, re, remote, src)
			}
			s.checkRemoteTopicJob(t, src, dst, remote)
			if got := topics.SiteOfTopic(remote, s.hitsTopic(t, dst)); got != src {
				t.Errorf("topics.SiteOfTopic(%q) = %q, want %q", remote, got, src)
			}
		}
	}
}

// checkRemoteTopicJob checks that the one-shot job mirror-topics-<dst> creates remote, the
// copy of src's hits, in dst's Kafka before dst's aggregator starts, with as many partitions
// as src's hits. The aggregator finds topics by pattern only at start and at its metadata
// refresh, minutes apart, so a copy that MirrorMaker created later would go uncounted for
// minutes; and a copy with another partition count would put a key's hits in the partition
// of another owner.
func (s *stack) checkRemoteTopicJob(t *testing.T, src, dst, remote string) {
	t.Helper()
	name := svc("mirror-topics", dst)
	job := s.service(t, name)
	argv := append(slices.Clone(job.Entrypoint), job.Command...)
	arg := func(flag string) string {
		if i := slices.Index(argv, flag); i >= 0 && i+1 < len(argv) {
			return argv[i+1]
		}
		return ""
	}
	if len(argv) == 0 || path.Base(argv[0]) != "kafka-topics.sh" || !slices.Contains(argv, "--create") || !slices.Contains(argv, "--if-not-exists") {
		t.Errorf("%s: runs %q, want kafka-topics.sh --create --if-not-exists", name, argv)
	}
	if arg("--topic") != remote {
		t.Errorf("%s: creates %q, want %q", name, arg("--topic"), remote)
	}
	s.checkBrokers(t, name, arg("--bootstrap-server"), dst)
	if d := job.DependsOn[svc("kafka", dst)]; d.Condition != "service_healthy" {
		t.Errorf("%s: must depend on %s being healthy", name, svc("kafka", dst))
	}
	if job.Restart != "no" {
		t.Errorf("%s: restart %q: a one-shot job needs restart: \"no\"", name, job.Restart)
	}
	tn := svc("topics", src)
	want := streamlimitArgs(t, tn, s.service(t, tn)).flags["hits-partitions"]
	if want == "" {
		want = fmt.Sprint(topics.DefaultPartitions) // topics ensure's default
	}
	if arg("--partitions") != want {
		t.Errorf("%s: %s gets %q partitions, but %s's hits has %s", name, remote, arg("--partitions"), src, want)
	}
	agg := svc("aggregator", dst)
	if d := s.service(t, agg).DependsOn[name]; d.Condition != "service_completed_successfully" {
		t.Errorf("%s: must depend on %s completing successfully", agg, name)
	}
}

// hitsTopic is the hits topic of data center dc, as its enforcer publishes it.
func (s *stack) hitsTopic(t *testing.T, dc string) string {
	t.Helper()
	name := svc("enforcer", dc)
	a := streamlimitArgs(t, name, s.service(t, name))
	if v, ok := a.flags["hits-topic"]; ok {
		return v
	}
	return topics.DefaultHitsTopic
}

// aggregatorPattern is the regular expression of hits topics that dc's aggregator
// consumes, as cmd/streamlimit computes it.
func (s *stack) aggregatorPattern(t *testing.T, dc string) *regexp.Regexp {
	t.Helper()
	name := svc("aggregator", dc)
	a := streamlimitArgs(t, name, s.service(t, name))
	if _, ok := a.flags["topics"]; ok {
		t.Fatalf("%s: --topics lists topics; the stack relies on the pattern", name)
	}
	pat := a.flags["topic-pattern"]
	if pat == "" {
		hits := topics.DefaultHitsTopic
		if v, ok := a.flags["hits-topic"]; ok {
			hits = v
		}
		pat = topics.HitsPattern(hits)
	}
	re, err := regexp.Compile(pat)
	if err != nil {
		t.Fatalf("%s: topic pattern: %v", name, err)
	}
	return re
}

func TestDataCenterServices(t *testing.T) {
	s := loadStack(t)
	partitions := map[string]string{}
	for _, dc := range s.dcs {
		// topics ensure: after Kafka is healthy, and run once.
		tn := svc("topics", dc)
		ts := s.service(t, tn)
		ta := streamlimitArgs(t, tn, ts)
		if !slices.Equal(ta.sub, []string{"topics", "ensure"}) {
			t.Errorf("%s: runs %q, want topics ensure", tn, ta.sub)
		}
		s.checkBrokers(t, tn, ta.flags["brokers"], dc)
		if d := ts.DependsOn[svc("kafka", dc)]; d.Condition != "service_healthy" {
			t.Errorf("%s: must depend on %s being healthy", tn, svc("kafka", dc))
		}
		if ts.Restart != "no" {
			t.Errorf("%s: restart %q: a one-shot job needs restart: \"no\"", tn, ts.Restart)
		}
		partitions[dc] = ta.flags["partitions"]

		// aggregator: its own DC's Kafka, its own hits and the others' copies.
		an := svc("aggregator", dc)
		as := s.service(t, an)
		aa := streamlimitArgs(t, an, as)
		if !slices.Equal(aa.sub, []string{"aggregator"}) {
			t.Errorf("%s: runs %q, want aggregator", an, aa.sub)
		}
		s.checkBrokers(t, an, aa.flags["brokers"], dc)
		if d := as.DependsOn[tn]; d.Condition != "service_completed_successfully" {
			t.Errorf("%s: must depend on %s completing successfully", an, tn)
		}
		if re := s.aggregatorPattern(t, dc); !re.MatchString(s.hitsTopic(t, dc)) {
			t.Errorf("%s: topic pattern %s does not match its own hits topic", an, re)
		}

		// enforcer: site = the data center, its Redis and Kafka, half of each limit while
		// the counts are stale, the check API on every interface of the container but
		// published on the host's loopback only.
		en := svc("enforcer", dc)
		es := s.service(t, en)
		ea := streamlimitArgs(t, en, es)
		if !slices.Equal(ea.sub, []string{"enforcer"}) {
			t.Errorf("%s: runs %q, want enforcer", en, ea.sub)
		}
		if ea.flags["site"] != dc {
			t.Errorf("%s: --site=%q, want %q (its data center, MirrorMaker's alias)", en, ea.flags["site"], dc)
		}
		s.checkBrokers(t, en, ea.flags["brokers"], dc)
		if got, want := ea.flags["redis-addr"], svc("redis", dc)+":"+redisPort; got != want {
			t.Errorf("%s: --redis-addr=%q, want %q", en, got, want)
		}
		if rs := s.service(t, svc("redis", dc)); rs.Healthcheck == nil {
			t.Errorf("%s: no healthcheck", svc("redis", dc))
		}
		if d := es.DependsOn[svc("redis", dc)]; d.Condition != "service_healthy" {
			t.Errorf("%s: must depend on %s being healthy", en, svc("redis", dc))
		}
		if d := es.DependsOn[tn]; d.Condition != "service_completed_successfully" {
			t.Errorf("%s: must depend on %s completing successfully", en, tn)
		}
		share, err := strconv.ParseFloat(ea.flags["default-share"], 64)
		if want := 1 / float64(len(s.dcs)); err != nil || share != want {
			t.Errorf("%s: --default-share=%q, want %v (1/number of data centers)", en, ea.flags["default-share"], want)
		}
		if ea.flags["sub-buckets"] != aa.flags["sub-buckets"] {
			t.Errorf("%s --sub-buckets=%q differs from %s's %q", en, ea.flags["sub-buckets"], an, aa.flags["sub-buckets"])
		}
		host, port, err := net.SplitHostPort(ea.flags["http-listen"])
		if err != nil || host != "0.0.0.0" {
			t.Errorf("%s: --http-listen=%q, want 0.0.0.0:PORT so that the host and the load generator reach it", en, ea.flags["http-listen"])
		}
		published := false
		for _, p := range es.Ports {
			hp := parsePort(t, en, p)
			published = published || (hp.target == port && hp.ip == "127.0.0.1")
		}
		if !published {
			t.Errorf("%s: the check API (container port %s) is not published on 127.0.0.1", en, port)
		}
		if _, err := rules.Load(hostPath(t, es, ea.flags["rules"])); err != nil {
			t.Errorf("%s: rules: %v", en, err)
		}
	}
	for _, dc := range s.dcs {
		if partitions[dc] != partitions[s.dcs[0]] {
			t.Errorf("hits partitions differ between data centers (%v): a key's copies would land in another partition than its own", partitions)
		}
	}
}

// recorder is a Decider that admits everything and keeps the requests it saw.
type recorder struct{ reqs []enforcer.Request }

func (r *recorder) DecideInto(_ context.Context, req enforcer.Request, res *enforcer.Result) {
	r.reqs = append(r.reqs, enforcer.Request{Domain: req.Domain, Descriptors: cloneDescs(req.Descriptors)})
	res.Code = enforcer.CodeOK
	res.Statuses = make([]enforcer.Status, len(req.Descriptors))
	for i := range res.Statuses {
		res.Statuses[i].Code = enforcer.CodeOK
	}
}

func cloneDescs(d [][]rules.Entry) [][]rules.Entry {
	out := make([][]rules.Entry, len(d))
	for i := range d {
		out[i] = slices.Clone(d[i])
	}
	return out
}

// globalRule returns the rule that the descriptor matches and fails unless it has a
// global limit: the one the stack demonstrates.
func globalRule(t *testing.T, cfg *rules.Config, domain string, entries []rules.Entry) *rules.Rule {
	t.Helper()
	r := cfg.Match(domain, entries)
	if r == nil {
		t.Fatalf("no rule of domain %q matches %v", domain, entries)
	}
	for _, l := range r.Limits {
		if l.Scope == rules.Global {
			return r
		}
	}
	t.Fatalf("rule %s (%s:%d) has no global limit", r.ID, r.File, r.Line)
	return nil
}

func TestLoadGeneratorHitsAGlobalLimitOnEveryEnforcer(t *testing.T) {
	s := loadStack(t)
	lg := s.service(t, loadgenService)
	script := ""
	for _, w := range append(slices.Clone(lg.Entrypoint), lg.Command...) {
		if strings.HasSuffix(w, ".sh") {
			script = hostPath(t, lg, w)
		}
	}
	if script == "" {
		t.Fatalf("%s: runs no mounted script (%q %q)", loadgenService, lg.Entrypoint, lg.Command)
	}
	t.Run("sh -n", func(t *testing.T) {
		testenv.RealParts(t) // runs sh
		if sh, err := exec.LookPath("sh"); err == nil {
			if out, err := exec.Command(sh, "-n", script).CombinedOutput(); err != nil {
				t.Errorf("%s: sh -n: %v\n%s", script, err, out)
			}
		}
	})
	env := lg.Environment
	var targets []string
	for _, u := range strings.Fields(env["ENFORCERS"]) {
		host, port, err := net.SplitHostPort(strings.TrimPrefix(u, "http://"))
		if err != nil {
			t.Errorf("%s: ENFORCERS: %q: %v", loadgenService, u, err)
			continue
		}
		targets = append(targets, host)
		es := s.service(t, host)
		_, lport, _ := net.SplitHostPort(streamlimitArgs(t, host, es).flags["http-listen"])
		if port != lport {
			t.Errorf("%s: %s, but %s listens on port %s", loadgenService, u, host, lport)
		}
		if _, ok := lg.DependsOn[host]; !ok {
			t.Errorf("%s: does not depend on %s", loadgenService, host)
		}
	}
	for _, dc := range s.dcs {
		if !slices.Contains(targets, svc("enforcer", dc)) {
			t.Errorf("%s: ENFORCERS %q leaves out %s: the heavy client must call every data center", loadgenService, env["ENFORCERS"], svc("enforcer", dc))
		}
	}
	// The heavy client's descriptor (and the light ones') must hit a global limit in the
	// rules both enforcers load.
	for _, dc := range s.dcs {
		en := svc("enforcer", dc)
		es := s.service(t, en)
		cfg, err := rules.Load(hostPath(t, es, streamlimitArgs(t, en, es).flags["rules"]))
		if err != nil {
			t.Fatalf("%s: %v", en, err)
		}
		for _, client := range append([]string{env["HEAVY"]}, strings.Fields(env["LIGHT"])...) {
			globalRule(t, cfg, env["DOMAIN"], []rules.Entry{{Key: env["KEY"], Value: client}})
		}
	}
}

func TestHTTPConfigMatchesRules(t *testing.T) {
	s := loadStack(t)
	for _, dc := range s.dcs {
		en := svc("enforcer", dc)
		es := s.service(t, en)
		ea := streamlimitArgs(t, en, es)
		path, ok := ea.flags["http-config"]
		if !ok {
			continue
		}
		// As the enforcer loads it: unknown fields are errors.
		data, err := os.ReadFile(hostPath(t, es, path))
		if err != nil {
			t.Fatal(err)
		}
		var hc httplimit.Config
		dec := yaml.NewDecoder(bytes.NewReader(data))
		dec.KnownFields(true)
		if err := dec.Decode(&hc); err != nil {
			t.Fatalf("%s: --http-config: %v", en, err)
		}
		rec := &recorder{}
		mw, err := httplimit.New(rec, httplimit.Options{Config: hc})
		if err != nil {
			t.Fatalf("%s: --http-config: %v", en, err)
		}
		// docs/operations.md's example request must become a descriptor of a global rule.
		req := httptest.NewRequest(http.MethodGet, "/v1/auth", nil)
		req.Header.Set("X-Client-Id", "heavy")
		w := httptest.NewRecorder()
		mw.AuthHandler(httplimit.AuthOptions{}).ServeHTTP(w, req)
		if w.Code != http.StatusNoContent || len(rec.reqs) != 1 || len(rec.reqs[0].Descriptors) == 0 {
			t.Fatalf("%s: /v1/auth with X-Client-Id: status %d, requests %v", en, w.Code, rec.reqs)
		}
		cfg, err := rules.Load(hostPath(t, es, ea.flags["rules"]))
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range rec.reqs[0].Descriptors {
			globalRule(t, cfg, rec.reqs[0].Domain, d)
		}
	}
}

func TestStartupOrder(t *testing.T) {
	s := loadStack(t)
	// Every dependency exists, waits on something that can report it, and the graph has
	// no cycle (Compose would refuse to start).
	for name, sv := range s.compose.Services {
		for dep, d := range sv.DependsOn {
			ds, ok := s.compose.Services[dep]
			if !ok {
				t.Errorf("%s: depends on unknown service %s", name, dep)
				continue
			}
			switch d.Condition {
			case "service_healthy":
				if ds.Healthcheck == nil || len(ds.Healthcheck.Test) == 0 {
					t.Errorf("%s: waits for %s to be healthy, which has no healthcheck", name, dep)
				}
			case "service_completed_successfully":
				if ds.Restart != "no" {
					t.Errorf("%s: waits for %s to complete, but %s restarts (%q)", name, dep, dep, ds.Restart)
				}
			case "service_started":
			default:
				t.Errorf("%s: depends on %s with condition %q", name, dep, d.Condition)
			}
		}
	}
	state := map[string]int{} // 1 visiting, 2 done
	var visit func(string, []string)
	visit = func(n string, stack []string) {
		switch state[n] {
		case 1:
			t.Errorf("dependency cycle: %s", strings.Join(append(stack, n), " → "))
			return
		case 2:
			return
		}
		state[n] = 1
		for dep := range s.compose.Services[n].DependsOn {
			visit(dep, append(stack, n))
		}
		state[n] = 2
	}
	for n := range s.compose.Services {
		visit(n, nil)
	}
}
