package helm_test

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"

	"github.com/streamlimit/streamlimit/enforcer/rules"
)

var update = flag.Bool("update", false, "rewrite testdata/*.yaml with what the chart renders now")

// variants are the installs the chart is rendered for: every `helm install`, `helm
// upgrade` and `helm template` of docs/kubernetes.md is one of them
// (TestDocsKubernetesCommands). What each renders is kept in testdata/<name>.yaml, which
// cmd/streamlimit's TestHelmChartArgs parses with the binary's own flags.
var variants = []struct {
	name string
	in   install
}{
	{"eu", install{release: "streamlimit-eu", namespace: "streamlimit",
		files: []string{"deploy/helm/examples/values-eu.yaml"}}},
	{"us", install{release: "streamlimit-us", namespace: "streamlimit",
		files: []string{"deploy/helm/examples/values-us.yaml"}}},
	{"eu-monitoring", install{release: "streamlimit-eu", namespace: "streamlimit",
		files: []string{"deploy/helm/examples/values-eu.yaml"},
		sets:  []string{"--set=serviceMonitor.enabled=true", "--set=dashboard.enabled=true"}}},
	{"eu-sidecars", install{release: "streamlimit-eu", namespace: "streamlimit",
		files: []string{"deploy/helm/examples/values-eu.yaml"},
		sets:  []string{"--set=enforcer.replicas=0"}}},
	{"eu-auth", install{release: "streamlimit-eu", namespace: "streamlimit",
		files: []string{"deploy/helm/examples/values-eu.yaml"},
		sets: []string{
			"--set=kafka.sasl.mechanism=SCRAM-SHA-512", "--set=kafka.sasl.user=streamlimit",
			"--set=kafka.sasl.passwordSecret.name=streamlimit-kafka",
			"--set=redis.passwordSecret.name=streamlimit-redis",
		}}},
	{"lab", install{release: "streamlimit", namespace: "lab",
		sets: []string{
			"--set=site=lab", "--set=kafka.brokers={kafka:9092}", "--set=topics.replicationFactor=1",
			"--set=enforcer.replicas=1", "--set=aggregator.replicas=1", "--set=enforcer.grpc=false",
		}}},
}

// TestChartDefaultsNeedADataCenter: the chart's defaults name no data center, and
// rendering them fails saying what to set, not with a half-configured release.
func TestChartDefaultsNeedADataCenter(t *testing.T) {
	for _, tc := range []struct {
		sets []string
		want string
	}{
		{nil, "site is required"},
		{[]string{"--set=site=eu"}, "kafka.brokers is required"},
		{[]string{"--set=site=eu", "--set=kafka.brokers={k:9092}"}, "enforcer.replicas > 1 needs redis.addrs"},
		{[]string{"--set=site=EU", "--set=kafka.brokers={k:9092}"}, "site must be lower-case"},
		{[]string{"--set=site=eu", "--set=kafka.brokers={k:9092}", "--set=redis.addrs={r:6379}", "--set=aggregator.replicas=13"}, "must not exceed topics.hitsPartitions"},
		{[]string{"--set=site=eu", "--set=kafka.brokers={k:9092}", "--set=redis.addrs={r:6379}", "--set=rules.x\\.json=x"}, "a rules file's name ends in .yaml"},
		// values.schema.json: a misspelt or mistyped value fails instead of being ignored.
		{[]string{"--set=site=eu", "--set=kafka.brokers={k:9092}", "--set=redis.addrs={r:6379}", "--set=enforcer.replica=2"}, "replica"},
		{[]string{"--set=site=eu", "--set=kafka.brokers={k:9092}", "--set=redis.addrs={r:6379}", "--set=aggregator.sessionTimeout=6"}, "sessionTimeout"},
	} {
		_, err := render(t, install{release: "streamlimit", sets: tc.sets})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err %v, want one saying %q", tc.sets, err, tc.want)
		}
	}
	// With those three set, the defaults render and hold.
	ms, err := render(t, install{release: "streamlimit", sets: []string{"--set=site=eu", "--set=kafka.brokers={k:9092}", "--set=redis.addrs={r:6379}"}})
	if err != nil {
		t.Fatal(err)
	}
	check(t, ms)
}

// TestChartVariants renders every variant, holds each object to the Kubernetes API types
// and the chart's promises (check), and compares it with testdata (-update rewrites it).
func TestChartVariants(t *testing.T) {
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			ms, err := render(t, v.in)
			if err != nil {
				t.Fatal(err)
			}
			check(t, ms)
			got := stream(ms)
			for i, line := range strings.Split(string(got), "\n") {
				if line != "" && strings.TrimSpace(line) == "" {
					t.Errorf("line %d of what renders is blanks only: a template's whitespace control leaks", i+1)
				}
			}
			golden := filepath.Join("testdata", v.name+".yaml")
			if *update {
				if err := os.WriteFile(golden, got, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (go test ./deploy/helm -run TestChartVariants -update writes it)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("%s is not what the chart renders now: go test ./deploy/helm -run TestChartVariants -update, and review the diff", golden)
			}
		})
	}
}

// serviceMonitor is the part of the Prometheus Operator's monitoring.coreos.com/v1
// ServiceMonitor the chart writes: decoding strictly into it catches a misspelt field.
type serviceMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Selector  metav1.LabelSelector `json:"selector"`
		Endpoints []struct {
			Port     string `json:"port"`
			Path     string `json:"path"`
			Interval string `json:"interval"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// objects are a release's rendered objects, decoded.
type objects struct {
	configMaps  map[string]*corev1.ConfigMap
	services    []*corev1.Service
	deployments []*appsv1.Deployment
	sets        []*appsv1.StatefulSet
	jobs        []*batchv1.Job
	pdbs        []*policyv1.PodDisruptionBudget
	monitors    []*serviceMonitor
}

// decode decodes every object strictly into the type of its kind: an unknown or misplaced
// field, a wrong type or a duplicate key is an error.
func decode(t *testing.T, ms []manifest) objects {
	t.Helper()
	o := objects{configMaps: map[string]*corev1.ConfigMap{}}
	for _, m := range ms {
		var obj any
		switch m.kind {
		case "ConfigMap":
			v := new(corev1.ConfigMap)
			o.configMaps[m.name], obj = v, v
		case "Service":
			v := new(corev1.Service)
			o.services, obj = append(o.services, v), v
		case "Deployment":
			v := new(appsv1.Deployment)
			o.deployments, obj = append(o.deployments, v), v
		case "StatefulSet":
			v := new(appsv1.StatefulSet)
			o.sets, obj = append(o.sets, v), v
		case "Job":
			v := new(batchv1.Job)
			o.jobs, obj = append(o.jobs, v), v
		case "PodDisruptionBudget":
			v := new(policyv1.PodDisruptionBudget)
			o.pdbs, obj = append(o.pdbs, v), v
		case "ServiceMonitor":
			v := new(serviceMonitor)
			o.monitors, obj = append(o.monitors, v), v
		default:
			t.Errorf("%s: kind %q the test does not know", m.template, m.kind)
			continue
		}
		if err := yaml.UnmarshalStrict(m.yaml, obj); err != nil {
			t.Errorf("%s: %s %s: %v", m.template, m.kind, m.name, err)
		}
	}
	return o
}

// flagValue returns the value of --name=value in args, as the chart writes every flag.
func flagValue(args []string, name string) (string, bool) {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
	}
	return "", false
}

// check holds one release's objects to what the chart promises.
func check(t *testing.T, ms []manifest) {
	t.Helper()
	o := decode(t, ms)
	if t.Failed() {
		return
	}
	if len(o.deployments) != 1 || len(o.sets) != 1 || len(o.pdbs) != 2 {
		t.Fatalf("want one enforcer Deployment, one aggregator StatefulSet and two PDBs; got %d, %d, %d", len(o.deployments), len(o.sets), len(o.pdbs))
	}
	enf, agg := o.deployments[0], o.sets[0]
	pods := map[string]*corev1.PodTemplateSpec{"enforcer": &enf.Spec.Template, "aggregator": &agg.Spec.Template}
	for _, j := range o.jobs {
		pods["job "+j.Name] = &j.Spec.Template
	}
	for what, p := range pods {
		checkPodSecurity(t, what, &p.Spec)
	}

	// Selectors: each workload's selects its pods; each Service and PDB selects pods.
	selects := func(sel *metav1.LabelSelector, p *corev1.PodTemplateSpec) bool {
		s, err := metav1.LabelSelectorAsSelector(sel)
		return err == nil && !s.Empty() && s.Matches(labels.Set(p.Labels))
	}
	if !selects(enf.Spec.Selector, &enf.Spec.Template) || !selects(agg.Spec.Selector, &agg.Spec.Template) {
		t.Error("a workload's selector does not select its own pods")
	}
	for _, pdb := range o.pdbs {
		n := 0
		for _, p := range []*corev1.PodTemplateSpec{&enf.Spec.Template, &agg.Spec.Template} {
			if selects(pdb.Spec.Selector, p) {
				n++
			}
		}
		if n != 1 || pdb.Spec.MaxUnavailable == nil {
			t.Errorf("PDB %s selects %d of the workloads (want 1), maxUnavailable %v", pdb.Name, n, pdb.Spec.MaxUnavailable)
		}
	}
	svcPorts := map[string]map[string]bool{} // service -> its ports' names
	for _, s := range o.services {
		svcPorts[s.Name] = map[string]bool{}
		for _, p := range s.Spec.Ports {
			svcPorts[s.Name][p.Name] = true
		}
		var sel *corev1.PodTemplateSpec
		for _, p := range []*corev1.PodTemplateSpec{&enf.Spec.Template, &agg.Spec.Template} {
			if labels.SelectorFromSet(s.Spec.Selector).Matches(labels.Set(p.Labels)) && len(s.Spec.Selector) > 0 {
				sel = p
			}
		}
		if sel == nil {
			t.Errorf("Service %s selects no workload's pods", s.Name)
			continue
		}
		for _, p := range s.Spec.Ports {
			if !hasPort(sel.Spec.Containers, p.TargetPort.String()) {
				t.Errorf("Service %s: target port %s is no container port of the pods it selects", s.Name, p.TargetPort.String())
			}
		}
	}

	checkEnforcer(t, o, enf)
	checkAggregator(t, o, agg, svcPorts)
	for _, j := range o.jobs {
		checkTopicsJob(t, j, agg)
	}
	for _, sm := range o.monitors {
		for _, ep := range sm.Spec.Endpoints {
			found := false
			for _, ports := range svcPorts {
				found = found || ports[ep.Port]
			}
			if !found || ep.Path != "/metrics" {
				t.Errorf("ServiceMonitor endpoint %+v: no Service has a port %q, or the path is not /metrics", ep, ep.Port)
			}
			if _, err := time.ParseDuration(ep.Interval); err != nil {
				t.Errorf("ServiceMonitor interval %q: %v", ep.Interval, err)
			}
		}
	}
	for name, cm := range o.configMaps {
		if j, ok := cm.Data["streamlimit.json"]; ok {
			want, err := os.ReadFile(filepath.Join(repoRoot, "deploy", "grafana", "streamlimit.json"))
			if err != nil {
				t.Fatal(err)
			}
			if strings.TrimRight(j, "\n") != strings.TrimRight(string(want), "\n") {
				t.Errorf("ConfigMap %s: the dashboard is not deploy/grafana/streamlimit.json", name)
			}
		}
	}
}

func hasPort(cs []corev1.Container, port string) bool {
	for _, c := range cs {
		for _, p := range c.Ports {
			if p.Name == port || strconv.Itoa(int(p.ContainerPort)) == port {
				return true
			}
		}
	}
	return false
}

func checkPodSecurity(t *testing.T, what string, spec *corev1.PodSpec) {
	t.Helper()
	ps := spec.SecurityContext
	if ps == nil || ps.RunAsNonRoot == nil || !*ps.RunAsNonRoot || ps.RunAsUser == nil || *ps.RunAsUser == 0 {
		t.Errorf("%s: the pod may run as root: %+v", what, ps)
	}
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		t.Errorf("%s: mounts a service account token it has no use for", what)
	}
	for _, c := range append(spec.InitContainers, spec.Containers...) {
		checkContainerSecurity(t, what, &c)
	}
}

// checkContainerSecurity: a streamlimit container runs the image's entrypoint with a
// locked-down security context and no secret in args or plain env.
func checkContainerSecurity(t *testing.T, what string, c *corev1.Container) {
	t.Helper()
	sc := c.SecurityContext
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.Capabilities == nil || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" {
		t.Errorf("%s: container %s: want a read-only root file system, no privilege escalation, every capability dropped: %+v", what, c.Name, sc)
	}
	if c.Image == "" || len(c.Args) == 0 || len(c.Command) != 0 {
		t.Errorf("%s: container %s: want the image's entrypoint with args: image %q command %q", what, c.Name, c.Image, c.Command)
	}
	for _, e := range c.Env {
		if strings.Contains(strings.ToLower(e.Name), "password") && e.Value != "" {
			t.Errorf("%s: container %s: %s in plain text; take it from a Secret", what, c.Name, e.Name)
		}
	}
	for _, a := range c.Args {
		if strings.Contains(a, "password") {
			t.Errorf("%s: container %s: a password in args: %s", what, c.Name, a)
		}
	}
}

// listenPort returns the port of a --*-listen flag's value.
func listenPort(t *testing.T, args []string, name string) string {
	t.Helper()
	v, ok := flagValue(args, name)
	if !ok {
		t.Errorf("no --%s in %q", name, args)
		return ""
	}
	host, port, ok := strings.Cut(v, ":")
	if !ok || host != "0.0.0.0" {
		t.Errorf("--%s=%s: want 0.0.0.0:PORT, reachable from kubelet and the Service", name, v)
	}
	return port
}

// checkProbe: the probe asks path on the container port that args' listen flag binds.
func checkProbe(t *testing.T, what string, c *corev1.Container, p *corev1.Probe, path, port string) {
	t.Helper()
	if p == nil || p.HTTPGet == nil {
		t.Errorf("%s: want an HTTP probe of %s", what, path)
		return
	}
	if p.HTTPGet.Path != path {
		t.Errorf("%s: probe path %s, want %s", what, p.HTTPGet.Path, path)
	}
	pp := p.HTTPGet.Port.String()
	for _, cp := range c.Ports {
		if cp.Name == pp {
			pp = strconv.Itoa(int(cp.ContainerPort))
		}
	}
	if pp != port {
		t.Errorf("%s: probe on port %s, but the listener is on %s", what, pp, port)
	}
}

func checkEnforcer(t *testing.T, o objects, d *appsv1.Deployment) {
	t.Helper()
	spec := &d.Spec.Template.Spec
	if len(spec.Containers) != 1 {
		t.Fatalf("enforcer pod: %d containers", len(spec.Containers))
	}
	c := &spec.Containers[0]
	if c.Args[0] != "enforcer" {
		t.Errorf("enforcer container runs %q", c.Args)
	}
	port := listenPort(t, c.Args, "http-listen")
	checkProbe(t, "enforcer readiness", c, c.ReadinessProbe, "/readyz", port)
	checkProbe(t, "enforcer liveness", c, c.LivenessProbe, "/healthz", port)
	if g, ok := flagValue(c.Args, "grpc-listen"); ok && g != "off" {
		listenPort(t, c.Args, "grpc-listen")
	}

	// Rules: a ConfigMap of the release mounted whole (no subPath, which kubelet never
	// updates), at the directory --rules names, and loadable by the rules package.
	dir, _ := flagValue(c.Args, "rules")
	var cm *corev1.ConfigMap
	for _, m := range c.VolumeMounts {
		if m.MountPath != dir {
			continue
		}
		if m.SubPath != "" || !m.ReadOnly {
			t.Errorf("rules mounted with subPath %q, readOnly %v: want the whole ConfigMap, read-only", m.SubPath, m.ReadOnly)
		}
		for _, v := range spec.Volumes {
			if v.Name == m.Name && v.ConfigMap != nil && len(v.ConfigMap.Items) == 0 {
				cm = o.configMaps[v.ConfigMap.Name]
			}
		}
	}
	if cm == nil {
		t.Fatalf("--rules=%s is not a mounted ConfigMap of the release", dir)
	}
	cfg, err := rules.LoadDir(kubeletLayout(t, cm.Data))
	if err != nil {
		t.Fatalf("rules ConfigMap %s: %v", cm.Name, err)
	}
	if len(cfg.Domains()) != len(cm.Data) {
		t.Errorf("rules ConfigMap %s: %d files, %d domains", cm.Name, len(cm.Data), len(cfg.Domains()))
	}

	// Shutdown: SIGTERM comes after preStop; then the enforcer drains and flushes for at
	// most --shutdown-timeout. The grace period must hold both, with room to spare.
	var pre time.Duration
	if lc := c.Lifecycle; lc != nil && lc.PreStop != nil && lc.PreStop.Sleep != nil {
		pre = time.Duration(lc.PreStop.Sleep.Seconds) * time.Second
	} else {
		t.Error("enforcer: no preStop sleep: the Service would still send requests to a stopping pod")
	}
	st, ok := flagValue(c.Args, "shutdown-timeout")
	sd, err := time.ParseDuration(st)
	if !ok || err != nil {
		t.Fatalf("enforcer: --shutdown-timeout %q: %v", st, err)
	}
	if g := graceOf(spec); g < pre+sd+5*time.Second {
		t.Errorf("enforcer: terminationGracePeriodSeconds %v < preStop %v + --shutdown-timeout %v + 5s", g, pre, sd)
	}
	if v, ok := flagValue(c.Args, "redis-addr"); ok && v != "" {
		// At least 1: a Deployment scaled to none (sidecars instead) may be scaled up.
		if n, _ := flagValue(c.Args, "site-enforcers"); n != strconv.Itoa(max(1, int(*d.Spec.Replicas))) {
			t.Errorf("enforcer: --site-enforcers=%s, but %d replicas share the site's Redis", n, *d.Spec.Replicas)
		}
	} else if *d.Spec.Replicas > 1 {
		t.Errorf("enforcer: %d replicas of one site without Redis", *d.Spec.Replicas)
	}
}

func graceOf(spec *corev1.PodSpec) time.Duration {
	if spec.TerminationGracePeriodSeconds == nil {
		return 30 * time.Second // Kubernetes' default
	}
	return time.Duration(*spec.TerminationGracePeriodSeconds) * time.Second
}

// aggregatorStop bounds an aggregator's stop after SIGTERM: its final publication and
// leave (leaveTimeout in aggregator/group.go) and its admin server's drain (serveHTTP's
// grace in cmd/streamlimit/aggregator.go), which run at the same time; summed here, to be
// safe.
const aggregatorStop = 5*time.Second + 5*time.Second

func checkAggregator(t *testing.T, o objects, s *appsv1.StatefulSet, svcPorts map[string]map[string]bool) {
	t.Helper()
	spec := &s.Spec.Template.Spec
	if len(spec.Containers) != 1 {
		t.Fatalf("aggregator pod: %d containers", len(spec.Containers))
	}
	c := &spec.Containers[0]
	if c.Args[0] != "aggregator" {
		t.Errorf("aggregator container runs %q", c.Args)
	}
	port := listenPort(t, c.Args, "admin-listen")
	checkProbe(t, "aggregator readiness", c, c.ReadinessProbe, "/readyz", port)
	checkProbe(t, "aggregator liveness", c, c.LivenessProbe, "/healthz", port)

	// The static member id is the pod's name: --instance-id=$(VAR), VAR metadata.name.
	id, _ := flagValue(c.Args, "instance-id")
	v, ok := strings.CutPrefix(id, "$(")
	v, ok2 := strings.CutSuffix(v, ")")
	found := false
	for _, e := range c.Env {
		if ok && ok2 && e.Name == v && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name" {
			found = true
		}
	}
	if !found {
		t.Errorf("aggregator: --instance-id=%s is not the pod's name", id)
	}
	if _, ok := svcPorts[s.Spec.ServiceName]; !ok {
		t.Errorf("aggregator: serviceName %s is no Service of the release", s.Spec.ServiceName)
	}
	for _, svc := range o.services {
		if svc.Name == s.Spec.ServiceName && svc.Spec.ClusterIP != corev1.ClusterIPNone {
			t.Errorf("aggregator: Service %s is not headless", svc.Name)
		}
	}
	if s.Spec.PodManagementPolicy != appsv1.ParallelPodManagement {
		t.Error("aggregator: pods start one by one, but one without slots is never ready")
	}
	if g := graceOf(spec); g < aggregatorStop+5*time.Second {
		t.Errorf("aggregator: terminationGracePeriodSeconds %v: want at least %v", g, aggregatorStop+5*time.Second)
	}
	if st, _ := flagValue(c.Args, "session-timeout"); st != "" {
		if _, err := time.ParseDuration(st); err != nil {
			t.Errorf("aggregator: --session-timeout=%s: %v", st, err)
		}
	}
}

func checkTopicsJob(t *testing.T, j *batchv1.Job, agg *appsv1.StatefulSet) {
	t.Helper()
	if h := j.Annotations["helm.sh/hook"]; h != "pre-install,pre-upgrade" {
		t.Errorf("job %s: helm.sh/hook %q, want pre-install,pre-upgrade", j.Name, h)
	}
	c := j.Spec.Template.Spec.Containers[0]
	if len(c.Args) < 2 || c.Args[0] != "topics" || c.Args[1] != "ensure" {
		t.Errorf("job %s runs %q, want topics ensure", j.Name, c.Args)
	}
	if j.Spec.Template.Spec.RestartPolicy != corev1.RestartPolicyNever {
		t.Errorf("job %s: restartPolicy %s", j.Name, j.Spec.Template.Spec.RestartPolicy)
	}
	// The job creates what the aggregators read.
	ac := agg.Spec.Template.Spec.Containers[0]
	for _, f := range []string{"brokers", "hits-topic", "counts-topic", "max-window"} {
		a, _ := flagValue(ac.Args, f)
		b, _ := flagValue(c.Args, f)
		if a != b {
			t.Errorf("--%s: the topics job has %q, the aggregators %q", f, b, a)
		}
	}
	if n, _ := flagValue(c.Args, "hits-partitions"); n != "" {
		if p, err := strconv.Atoi(n); err != nil || int32(p) < *agg.Spec.Replicas {
			t.Errorf("--hits-partitions=%s: fewer than the %d aggregators", n, *agg.Spec.Replicas)
		}
	}
}

// kubeletLayout writes files as kubelet lays out a ConfigMap volume, and returns the
// directory: the data in a timestamped directory, ..data a symbolic link to it, and each
// file a symbolic link through ..data. An edit writes a new directory and swaps ..data.
func kubeletLayout(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	swapData(t, dir, "..2026_01_01_00_00_00.000000001", files)
	for name := range files {
		if err := os.Symlink(filepath.Join("..data", name), filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// swapData writes files into dir/ts and points dir/..data at it atomically, as kubelet does.
func swapData(t *testing.T, dir, ts string, files map[string]string) {
	t.Helper()
	if err := os.Mkdir(filepath.Join(dir, ts), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, ts, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tmp := filepath.Join(dir, "..data_tmp")
	if err := os.Symlink(ts, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
}

// TestChartRulesReloadOnConfigMapSwap: an edit of the rules ConfigMap reaches a running
// enforcer. kubelet replaces the mounted directory by swapping a symbolic link, which the
// rules Reloader (polling content, not mtimes) sees; the hidden ..data entries are not
// read as rules files.
func TestChartRulesReloadOnConfigMapSwap(t *testing.T) {
	ms, err := render(t, variants[0].in)
	if err != nil {
		t.Fatal(err)
	}
	o := decode(t, ms)
	cm := o.configMaps["streamlimit-eu-rules"]
	if cm == nil {
		t.Fatal("no streamlimit-eu-rules ConfigMap")
	}
	dir := kubeletLayout(t, cm.Data)
	r, err := rules.NewReloader(dir, rules.ReloaderOptions{})
	if err != nil {
		t.Fatal(err)
	}
	edited := map[string]string{}
	for name, body := range cm.Data {
		edited[name] = strings.Replace(body, "requests_per_unit: 120", "requests_per_unit: 60", 1)
	}
	swapData(t, dir, "..2026_01_01_00_01_00.000000002", edited)
	// The Reloader loads a change that two checks in a row saw the same (it settled):
	// Run spaces them rules.DefaultReloadSettle apart.
	if changed, err := r.Check(); err != nil || changed {
		t.Fatalf("first check after the swap: changed %v, err %v; want the change seen, not yet loaded", changed, err)
	}
	changed, err := r.Check()
	if err != nil || !changed {
		t.Fatalf("after the swap: changed %v, err %v", changed, err)
	}
	if got := fmt.Sprint(r.Current().Files()); !strings.Contains(got, "api.yaml") {
		t.Errorf("files after the swap: %s", got)
	}
	var limits []int64
	for _, rule := range r.Current().Rules() {
		for _, l := range rule.Limits {
			limits = append(limits, l.Requests)
		}
	}
	if fmt.Sprint(limits) != "[60]" {
		t.Errorf("limits after the swap: %v, want [60]", limits)
	}
}

// TestStrictDecodeCatchesAMisspeltField: what check relies on, a field the API type lacks
// (here replica for replicas) fails decoding instead of being dropped, as the API server
// would drop it.
func TestStrictDecodeCatchesAMisspeltField(t *testing.T) {
	doc := []byte("apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: x\nspec:\n  replica: 3\n")
	if err := yaml.UnmarshalStrict(doc, new(appsv1.Deployment)); err == nil || !strings.Contains(err.Error(), "replica") {
		t.Errorf("err %v, want one naming the unknown field", err)
	}
}
