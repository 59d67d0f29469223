// Package helm_test renders the Helm chart in deploy/helm/streamlimit with Helm's own Go
// packages (no helm binary, no cluster) and holds what it renders to the Kubernetes API
// types, the binary's flags and the rules parser.
package helm_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/releaseutil"
	"helm.sh/helm/v3/pkg/strvals"
	"sigs.k8s.io/yaml"
)

const (
	repoRoot = "../.."
	chartDir = "streamlimit"
	// kubeVersion is the cluster version the chart is rendered for: the oldest its
	// kubeVersion constraint admits (preStop sleep actions need 1.30).
	kubeVersion = "v1.30.0"
)

// install is one `helm install` or `helm template`: a release name, a namespace, values
// files (paths from the repository root) and --set / --set-string assignments, in order.
type install struct {
	release, namespace string
	files              []string
	sets               []string // "--set=a=b" or "--set-string=a=b"
}

// manifest is one rendered object: its template, and its YAML.
type manifest struct {
	template string
	yaml     []byte
	kind     string
	name     string
}

func loadChart(t testing.TB) *chart.Chart {
	t.Helper()
	c, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// values merges in's values files and assignments as helm does: files first, in order,
// then the --set flags in order.
func (in install) values() (map[string]any, error) {
	vals := map[string]any{}
	for _, f := range in.files {
		b, err := os.ReadFile(filepath.Join(repoRoot, f))
		if err != nil {
			return nil, err
		}
		var m map[string]any
		if err := yaml.Unmarshal(b, &m); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		vals = chartutil.MergeTables(m, vals)
	}
	for _, s := range in.sets {
		var err error
		switch {
		case strings.HasPrefix(s, "--set="):
			err = strvals.ParseInto(strings.TrimPrefix(s, "--set="), vals)
		case strings.HasPrefix(s, "--set-string="):
			err = strvals.ParseIntoString(strings.TrimPrefix(s, "--set-string="), vals)
		default:
			err = fmt.Errorf("unknown assignment %q", s)
		}
		if err != nil {
			return nil, err
		}
	}
	return vals, nil
}

// render renders the chart for in as `helm template` (hooks included) does, and splits
// the result into objects in Helm's install order of templates.
func render(t testing.TB, in install) ([]manifest, error) {
	t.Helper()
	c := loadChart(t)
	if !chartutil.IsCompatibleRange(c.Metadata.KubeVersion, kubeVersion) {
		t.Fatalf("chart kubeVersion %q does not admit %s", c.Metadata.KubeVersion, kubeVersion)
	}
	vals, err := in.values()
	if err != nil {
		return nil, err
	}
	caps := chartutil.DefaultCapabilities.Copy()
	kv, err := chartutil.ParseKubeVersion(kubeVersion)
	if err != nil {
		t.Fatal(err)
	}
	caps.KubeVersion = *kv
	ns := in.namespace
	if ns == "" {
		ns = "default"
	}
	rv, err := chartutil.ToRenderValues(c, vals, chartutil.ReleaseOptions{
		Name: in.release, Namespace: ns, Revision: 1, IsInstall: true,
	}, caps)
	if err != nil {
		return nil, err
	}
	out, err := engine.Render(c, rv)
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(out))
	for n := range out {
		names = append(names, n)
	}
	slices.Sort(names)
	var ms []manifest
	for _, n := range names {
		if !strings.HasSuffix(n, ".yaml") {
			continue // _helpers.tpl, NOTES.txt
		}
		docs := releaseutil.SplitManifests(out[n])
		keys := make([]string, 0, len(docs))
		for k := range docs {
			keys = append(keys, k)
		}
		// SplitManifests names them manifest-0, manifest-1, ...: keep their order.
		slices.SortFunc(keys, func(a, b string) int { return manifestIndex(a) - manifestIndex(b) })
		for _, k := range keys {
			doc := strings.TrimSpace(docs[k])
			if doc == "" {
				continue
			}
			var head struct {
				Kind     string `json:"kind"`
				Metadata struct {
					Name string `json:"name"`
				} `json:"metadata"`
			}
			if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
				return nil, fmt.Errorf("%s: %w\n%s", n, err, doc)
			}
			ms = append(ms, manifest{template: n, yaml: []byte(doc + "\n"), kind: head.Kind, name: head.Metadata.Name})
		}
	}
	return ms, nil
}

func manifestIndex(k string) int {
	var i int
	if _, err := fmt.Sscanf(k, "manifest-%d", &i); err != nil {
		panic(k)
	}
	return i
}

// stream is the objects as one YAML stream, each headed by its template's name as
// `helm template` heads them.
func stream(ms []manifest) []byte {
	var b bytes.Buffer
	for _, m := range ms {
		fmt.Fprintf(&b, "---\n# Source: %s\n%s", m.template, m.yaml)
	}
	return b.Bytes()
}
