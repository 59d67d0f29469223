package helm_test

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"
)

const kubernetesDoc = "docs/kubernetes.md"

// docBlocks returns the fenced blocks of docs/kubernetes.md of one language, backslash
// continuations joined.
func docBlocks(t *testing.T, lang string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, kubernetesDoc))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for i, p := range strings.Split(string(b), "```") {
		if blk, ok := strings.CutPrefix(p, lang+"\n"); ok && i%2 == 1 {
			out = append(out, strings.ReplaceAll(blk, "\\\n", " "))
		}
	}
	return out
}

// words splits a shell command line into words: blanks separate them, single and double
// quotes group them (no escapes or expansions: the doc's commands use none).
func words(t *testing.T, line string) []string {
	t.Helper()
	var out []string
	var cur strings.Builder
	var quote rune
	in := false
	for _, r := range line {
		switch {
		case quote != 0 && r == quote:
			quote = 0
		case quote != 0:
			cur.WriteRune(r)
		case r == '\'' || r == '"':
			quote, in = r, true
		case r == ' ' || r == '\t':
			if in {
				out = append(out, cur.String())
				cur.Reset()
				in = false
			}
		default:
			cur.WriteRune(r)
			in = true
		}
	}
	if quote != 0 {
		t.Fatalf("unbalanced quote in %q", line)
	}
	if in {
		out = append(out, cur.String())
	}
	return out
}

// takeFlag removes --name V / --name=V / -s V from ws (each time it occurs) and returns the
// values in order.
func takeFlag(ws []string, names ...string) ([]string, []string) {
	var vals, rest []string
	for i := 0; i < len(ws); i++ {
		w, matched := ws[i], false
		for _, n := range names {
			if w == n && i+1 < len(ws) {
				vals, matched = append(vals, ws[i+1]), true
				i++
				break
			}
			if v, ok := strings.CutPrefix(w, n+"="); ok && strings.HasPrefix(n, "--") {
				vals, matched = append(vals, v), true
				break
			}
		}
		if !matched {
			rest = append(rest, w)
		}
	}
	return vals, rest
}

// release is what one helm command of the doc installs, rendered.
type release struct {
	context string
	in      install
	o       objects
}

// TestDocsKubernetesCommands keeps every helm and kubectl command of docs/kubernetes.md
// one that the tests exercise: each helm install, upgrade or template is one of the
// variants (TestChartVariants renders and checks it, and TestHelmChartArgs parses its
// containers' args); each kubectl command acts on what those releases render (a
// namespace, Secret, rollout, pod selector or Service port they have) or applies an
// example file that TestExamples checks.
func TestDocsKubernetesCommands(t *testing.T) {
	var helmLines, kubectlLines [][]string
	for _, blk := range docBlocks(t, "sh") {
		sc := bufio.NewScanner(strings.NewReader(blk))
		for sc.Scan() {
			line, _, _ := strings.Cut(sc.Text(), "  #")
			ws := words(t, strings.TrimSpace(line))
			switch {
			case len(ws) > 0 && ws[0] == "helm":
				helmLines = append(helmLines, ws)
			case len(ws) > 0 && ws[0] == "kubectl":
				kubectlLines = append(kubectlLines, ws)
			}
		}
	}
	if len(helmLines) < 4 || len(kubectlLines) < 4 {
		t.Fatalf("found %d helm and %d kubectl commands in %s: want the install's", len(helmLines), len(kubectlLines), kubernetesDoc)
	}

	var releases []release
	for _, ws := range helmLines {
		line := strings.Join(ws, " ")
		ctx, ws := takeFlag(ws[1:], "--kube-context")
		ns, ws := takeFlag(ws, "-n", "--namespace")
		files, ws := takeFlag(ws, "-f", "--values")
		// --set and --set-string keep their relative order: take them in one pass.
		var sets, rest []string
		for i := 0; i < len(ws); i++ {
			switch w := ws[i]; {
			case (w == "--set" || w == "--set-string") && i+1 < len(ws):
				sets = append(sets, w+"="+ws[i+1])
				i++
			case strings.HasPrefix(w, "--set=") || strings.HasPrefix(w, "--set-string="):
				sets = append(sets, w)
			case slices.Contains([]string{"--wait", "--atomic", "--create-namespace", "--install"}, w):
			case strings.HasPrefix(w, "-"):
				t.Errorf("%s: %q: a helm flag the test does not know", kubernetesDoc, line)
			default:
				rest = append(rest, w)
			}
		}
		if len(rest) != 3 || !slices.Contains([]string{"install", "upgrade", "template"}, rest[0]) || rest[2] != "deploy/helm/streamlimit" {
			t.Errorf("%s: %q: want helm install|upgrade|template RELEASE deploy/helm/streamlimit [flags]", kubernetesDoc, line)
			continue
		}
		in := install{release: rest[1], files: files, sets: sets}
		if len(ns) > 0 {
			in.namespace = ns[len(ns)-1]
		}
		found := false
		for _, v := range variants {
			if v.in.release == in.release && v.in.namespace == in.namespace && slices.Equal(v.in.files, in.files) && slices.Equal(v.in.sets, in.sets) {
				found = true
			}
		}
		if !found {
			t.Errorf("%s: %q is none of the variants TestChartVariants renders: add it there (%+v)", kubernetesDoc, line, in)
			continue
		}
		ms, err := render(t, in)
		if err != nil {
			t.Errorf("%s: %q: %v", kubernetesDoc, line, err)
			continue
		}
		r := release{in: in, o: decode(t, ms)}
		if len(ctx) > 0 {
			r.context = ctx[0]
		}
		releases = append(releases, r)
	}

	for _, ws := range kubectlLines {
		line := strings.Join(ws, " ")
		ctx, ws := takeFlag(ws[1:], "--context")
		ns, ws := takeFlag(ws, "-n", "--namespace")
		c, n := "", ""
		if len(ctx) > 0 {
			c = ctx[0]
		}
		if len(ns) > 0 {
			n = ns[0]
		}
		// The releases installed in that context and namespace.
		var rs []release
		for _, r := range releases {
			if r.context == c && (n == "" || r.in.namespace == n) {
				rs = append(rs, r)
			}
		}
		if err := checkKubectl(ws, rs); err != nil {
			t.Errorf("%s: %q: %v", kubernetesDoc, line, err)
		}
	}
}

// checkKubectl says whether the kubectl command ws acts on what the releases rs render.
func checkKubectl(ws []string, rs []release) error {
	verb := strings.Join(ws[:min(2, len(ws))], " ")
	switch {
	case verb == "create namespace" && len(ws) == 3:
		for _, r := range rs {
			if r.in.namespace == ws[2] {
				return nil
			}
		}
		return fmt.Errorf("no release of the doc is installed in namespace %s there", ws[2])

	case verb == "create secret" && len(ws) == 5 && ws[2] == "generic":
		key, ok := strings.CutPrefix(ws[4], "--from-literal=")
		key, _, _ = strings.Cut(key, "=")
		if !ok {
			return fmt.Errorf("want --from-literal=KEY=VALUE")
		}
		for _, r := range rs {
			for _, p := range podSpecs(r.o) {
				for _, c := range p.Containers {
					for _, e := range c.Env {
						if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil && e.ValueFrom.SecretKeyRef.Name == ws[3] && e.ValueFrom.SecretKeyRef.Key == key {
							return nil
						}
					}
				}
			}
		}
		return fmt.Errorf("no container of the releases there reads key %s of Secret %s", key, ws[3])

	case verb == "apply -f" && len(ws) == 3:
		if !strings.HasPrefix(ws[2], "deploy/helm/examples/") {
			return fmt.Errorf("applies %s, which TestExamples does not check", ws[2])
		}
		_, err := os.Stat(filepath.Join(repoRoot, ws[2]))
		return err

	case verb == "rollout status" && len(ws) == 3:
		kind, name, _ := strings.Cut(ws[2], "/")
		for _, r := range rs {
			for _, d := range r.o.deployments {
				if kind == "deployment" && d.Name == name {
					return nil
				}
			}
			for _, s := range r.o.sets {
				if kind == "statefulset" && s.Name == name {
					return nil
				}
			}
		}
		return fmt.Errorf("the releases there have no %s", ws[2])

	case verb == "get pods" && len(ws) == 4 && ws[2] == "-l":
		sel, err := labels.Parse(ws[3])
		if err != nil {
			return err
		}
		for _, r := range rs {
			for _, p := range podTemplates(r.o) {
				if sel.Matches(labels.Set(p.Labels)) {
					return nil
				}
			}
		}
		return fmt.Errorf("selects no pod of the releases there")

	case ws[0] == "port-forward" && len(ws) == 3:
		name, ok := strings.CutPrefix(ws[1], "svc/")
		_, port, _ := strings.Cut(ws[2], ":")
		if !ok {
			return fmt.Errorf("want port-forward svc/NAME LOCAL:PORT")
		}
		for _, r := range rs {
			for _, s := range r.o.services {
				for _, p := range s.Spec.Ports {
					if s.Name == name && fmt.Sprint(p.Port) == port {
						return nil
					}
				}
			}
		}
		return fmt.Errorf("the releases there have no Service %s with port %s", name, port)
	}
	return fmt.Errorf("a kubectl command the test does not know")
}

func podTemplates(o objects) []*corev1.PodTemplateSpec {
	var ps []*corev1.PodTemplateSpec
	for _, d := range o.deployments {
		ps = append(ps, &d.Spec.Template)
	}
	for _, s := range o.sets {
		ps = append(ps, &s.Spec.Template)
	}
	for _, j := range o.jobs {
		ps = append(ps, &j.Spec.Template)
	}
	return ps
}

func podSpecs(o objects) []*corev1.PodSpec {
	var ps []*corev1.PodSpec
	for _, p := range podTemplates(o) {
		ps = append(ps, &p.Spec)
	}
	return ps
}

// TestDocsKubernetesExamplesQuoted: a YAML block of docs/kubernetes.md that starts by
// naming an example file is that file, word for word.
func TestDocsKubernetesExamplesQuoted(t *testing.T) {
	n := 0
	for _, blk := range docBlocks(t, "yaml") {
		first, _, _ := strings.Cut(blk, "\n")
		name, _, ok := strings.Cut(strings.TrimPrefix(first, "# "), ":")
		if !ok || !strings.HasPrefix(name, "deploy/helm/examples/") {
			t.Errorf("%s: a YAML block that does not start by naming its example file: %q", kubernetesDoc, first)
			continue
		}
		b, err := os.ReadFile(filepath.Join(repoRoot, name))
		if err != nil {
			t.Error(err)
			continue
		}
		if string(b) != blk {
			t.Errorf("%s: the block of %s is not the file", kubernetesDoc, name)
		}
		n++
	}
	if n == 0 {
		t.Errorf("%s quotes no example", kubernetesDoc)
	}
}

// strimziMM2 is the part of Strimzi's kafka.strimzi.io/v1beta2 KafkaMirrorMaker2 the
// examples use: decoding strictly into it catches a misspelt or misplaced field.
type strimziMM2 struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Version        string `json:"version"`
		Replicas       int    `json:"replicas"`
		ConnectCluster string `json:"connectCluster"`
		Clusters       []struct {
			Alias            string         `json:"alias"`
			BootstrapServers string         `json:"bootstrapServers"`
			Config           map[string]any `json:"config"`
			TLS              *struct {
				TrustedCertificates []struct {
					SecretName  string `json:"secretName"`
					Certificate string `json:"certificate"`
				} `json:"trustedCertificates"`
			} `json:"tls"`
		} `json:"clusters"`
		Mirrors []struct {
			SourceCluster   string `json:"sourceCluster"`
			TargetCluster   string `json:"targetCluster"`
			TopicsPattern   string `json:"topicsPattern"`
			SourceConnector struct {
				TasksMax int            `json:"tasksMax"`
				Config   map[string]any `json:"config"`
			} `json:"sourceConnector"`
			HeartbeatConnector *struct {
				Config map[string]any `json:"config"`
			} `json:"heartbeatConnector"`
		} `json:"mirrors"`
	} `json:"spec"`
}

// properties reads deploy/mm2.properties' key = value lines.
func properties(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "deploy", "mm2.properties"))
	if err != nil {
		t.Fatal(err)
	}
	p := map[string]string{}
	for line := range strings.Lines(string(b)) {
		line = strings.TrimSpace(line)
		if k, v, ok := strings.Cut(line, "="); ok && !strings.HasPrefix(line, "#") {
			p[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
	}
	return p
}

// dcValues are the parts of an example values file the MirrorMaker examples must agree with.
type dcValues struct {
	Site  string `json:"site"`
	Kafka struct {
		Brokers []string `json:"brokers"`
	} `json:"kafka"`
}

// TestExamples holds deploy/helm/examples to the rest: the MirrorMaker 2 resources copy
// each data center's hits topic, and only it, into the other under the replication policy
// and settings of deploy/mm2.properties, with the releases' sites as the cluster aliases
// and their brokers as the targets; the sidecar example is a valid Deployment that mounts
// the eu release's rules ConfigMap in its namespace.
func TestExamples(t *testing.T) {
	props := properties(t)
	dcs := map[string]dcValues{}
	for _, name := range []string{"values-eu.yaml", "values-us.yaml"} {
		b, err := os.ReadFile(filepath.Join("examples", name))
		if err != nil {
			t.Fatal(err)
		}
		var v dcValues
		if err := yaml.Unmarshal(b, &v); err != nil {
			t.Fatal(err)
		}
		dcs[v.Site] = v
	}
	hits := variantHitsTopic(t)
	directions := map[string]bool{}
	for _, name := range []string{"mm2-eu.yaml", "mm2-us.yaml"} {
		b, err := os.ReadFile(filepath.Join("examples", name))
		if err != nil {
			t.Fatal(err)
		}
		var m strimziMM2
		if err := yaml.UnmarshalStrict(b, &m); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if m.APIVersion != "kafka.strimzi.io/v1beta2" || m.Kind != "KafkaMirrorMaker2" {
			t.Errorf("%s: %s %s", name, m.APIVersion, m.Kind)
		}
		aliases := map[string]string{}
		for _, c := range m.Spec.Clusters {
			if _, ok := dcs[c.Alias]; !ok {
				t.Errorf("%s: cluster alias %s is no release's site", name, c.Alias)
			}
			aliases[c.Alias] = c.BootstrapServers
		}
		if len(m.Spec.Mirrors) != 1 {
			t.Fatalf("%s: %d mirrors, want one direction", name, len(m.Spec.Mirrors))
		}
		mi := m.Spec.Mirrors[0]
		directions[mi.SourceCluster+"->"+mi.TargetCluster] = true
		if mi.SourceCluster == mi.TargetCluster || m.Spec.ConnectCluster != mi.TargetCluster {
			t.Errorf("%s: %s->%s run in %s: want it to run in its target", name, mi.SourceCluster, mi.TargetCluster, m.Spec.ConnectCluster)
		}
		if got, want := aliases[mi.TargetCluster], dcs[mi.TargetCluster].Kafka.Brokers; len(want) == 0 || got != want[0] {
			t.Errorf("%s: target %s at %s, but its release uses %v", name, mi.TargetCluster, got, want)
		}
		if want := props[mi.SourceCluster+"->"+mi.TargetCluster+".topics"]; mi.TopicsPattern != want || want != hits {
			t.Errorf("%s: topicsPattern %q; mm2.properties has %q, the releases' hits topic is %q", name, mi.TopicsPattern, want, hits)
		}
		for _, cfg := range []map[string]any{mi.SourceConnector.Config, mi.HeartbeatConnector.Config} {
			for _, k := range []string{"replication.policy.class", "replication.policy.separator"} {
				if got := fmt.Sprint(cfg[k]); got != props[k] {
					t.Errorf("%s: %s %q, mm2.properties %q", name, k, got, props[k])
				}
			}
		}
		for _, k := range []string{"sync.topic.configs.enabled", "sync.topic.acls.enabled", "refresh.topics.interval.seconds"} {
			if got := fmt.Sprint(mi.SourceConnector.Config[k]); got != props[k] {
				t.Errorf("%s: %s %q, mm2.properties %q", name, k, got, props[k])
			}
		}
	}
	if !directions["eu->us"] || !directions["us->eu"] {
		t.Errorf("directions %v: want both", directions)
	}

	b, err := os.ReadFile(filepath.Join("examples", "sidecar.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var d appsv1.Deployment
	if err := yaml.UnmarshalStrict(b, &d); err != nil {
		t.Fatalf("sidecar.yaml: %v", err)
	}
	ms, err := render(t, variants[0].in)
	if err != nil {
		t.Fatal(err)
	}
	o := decode(t, ms)
	var side *corev1.Container
	for i, c := range d.Spec.Template.Spec.InitContainers {
		if len(c.Args) > 0 && c.Args[0] == "enforcer" {
			side = &d.Spec.Template.Spec.InitContainers[i]
		}
	}
	if side == nil || side.RestartPolicy == nil || *side.RestartPolicy != corev1.ContainerRestartPolicyAlways {
		t.Fatal("sidecar.yaml: no enforcer as a native sidecar (an init container with restartPolicy Always)")
	}
	if ps := d.Spec.Template.Spec.SecurityContext; ps == nil || ps.RunAsNonRoot == nil || !*ps.RunAsNonRoot {
		t.Error("sidecar.yaml: the pod may run as root")
	}
	checkContainerSecurity(t, "sidecar.yaml", side)
	port := listenPort(t, side.Args, "http-listen")
	checkProbe(t, "sidecar readiness", side, side.ReadinessProbe, "/readyz", port)
	checkProbe(t, "sidecar liveness", side, side.LivenessProbe, "/healthz", port)
	if n, _ := flagValue(side.Args, "site-enforcers"); n != fmt.Sprint(*d.Spec.Replicas) {
		t.Errorf("sidecar.yaml: --site-enforcers=%s for %d replicas", n, *d.Spec.Replicas)
	}
	enf := o.deployments[0].Spec.Template.Spec.Containers[0]
	for _, f := range []string{"site", "brokers", "redis-addr", "default-share", "rules"} {
		a, _ := flagValue(side.Args, f)
		b, _ := flagValue(enf.Args, f)
		if a != b {
			t.Errorf("sidecar.yaml: --%s=%s, the eu release's enforcers --%s=%s", f, a, f, b)
		}
	}
	if d.Namespace != variants[0].in.namespace {
		t.Errorf("sidecar.yaml: namespace %s: the rules ConfigMap is in %s", d.Namespace, variants[0].in.namespace)
	}
	for _, v := range d.Spec.Template.Spec.Volumes {
		if v.ConfigMap != nil && o.configMaps[v.ConfigMap.Name] == nil {
			t.Errorf("sidecar.yaml: mounts ConfigMap %s, which the eu release does not have", v.ConfigMap.Name)
		}
	}
	grace := graceOf(&d.Spec.Template.Spec)
	if st, _ := flagValue(side.Args, "shutdown-timeout"); st == "" && grace < 10e9+5e9 {
		t.Errorf("sidecar.yaml: grace period %v is shorter than the default --shutdown-timeout with room", grace)
	}
}

// variantHitsTopic is the hits topic of the eu release.
func variantHitsTopic(t *testing.T) string {
	t.Helper()
	ms, err := render(t, variants[0].in)
	if err != nil {
		t.Fatal(err)
	}
	o := decode(t, ms)
	v, _ := flagValue(o.sets[0].Spec.Template.Spec.Containers[0].Args, "hits-topic")
	return v
}
