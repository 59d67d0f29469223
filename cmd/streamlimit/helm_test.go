package main

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// podContainer is a container of a rendered Kubernetes object: its args and the names of
// its environment variables.
type podContainer struct {
	Name string   `yaml:"name"`
	Args []string `yaml:"args"`
	Env  []struct {
		Name string `yaml:"name"`
	} `yaml:"env"`
}

// containersOf returns every container (and init container) anywhere in doc.
func containersOf(doc any) []podContainer {
	var out []podContainer
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, e := range v {
				if k == "containers" || k == "initContainers" {
					b, _ := yaml.Marshal(e)
					var cs []podContainer
					if yaml.Unmarshal(b, &cs) == nil {
						out = append(out, cs...)
					}
					continue
				}
				walk(e)
			}
		case []any:
			for _, e := range v {
				walk(e)
			}
		}
	}
	walk(doc)
	return out
}

// kubeVar is a dependent environment variable reference in args, which kubelet expands.
var kubeVar = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// TestHelmChartArgs runs the args of every container the Helm chart renders
// (deploy/helm/testdata, kept equal to what the chart renders by deploy/helm's
// TestChartVariants) and of the sidecar example through the binary's own commands and
// flags, as the image's entrypoint would: each names a command that exists, with flags it
// has and values they accept, and every $(VAR) it uses is one of the container's env.
func TestHelmChartArgs(t *testing.T) {
	files, err := filepath.Glob("../../deploy/helm/testdata/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, "../../deploy/helm/examples/sidecar.yaml")
	if len(files) < 3 {
		t.Fatalf("found %v: want the chart's rendered variants", files)
	}
	n := 0
	commands := map[string]bool{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(b))
		for {
			var doc any
			if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			for _, c := range containersOf(doc) {
				if len(c.Args) == 0 || strings.HasPrefix(c.Args[0], "-") {
					continue // not streamlimit's: the sidecar example's application
				}
				n++
				env := map[string]bool{}
				for _, e := range c.Env {
					env[e.Name] = true
				}
				args := make([]string, len(c.Args))
				for i, a := range c.Args {
					args[i] = kubeVar.ReplaceAllStringFunc(a, func(m string) string {
						name := kubeVar.FindStringSubmatch(m)[1]
						if !env[name] {
							t.Errorf("%s: container %s: %s is no env of the container: kubelet leaves it as it is", filepath.Base(f), c.Name, m)
						}
						return "pod-0"
					})
				}
				root := newRootCmd()
				cmd, rest, err := root.Find(args)
				if err != nil || cmd == root || !cmd.Runnable() {
					t.Errorf("%s: container %s: %q: no such command (%v)", filepath.Base(f), c.Name, args, err)
					continue
				}
				commands[cmd.CommandPath()] = true
				if err := cmd.ParseFlags(rest); err != nil {
					t.Errorf("%s: container %s: %q: %v", filepath.Base(f), c.Name, args, err)
					continue
				}
				if cmd.Args != nil {
					if err := cmd.Args(cmd, cmd.Flags().Args()); err != nil {
						t.Errorf("%s: container %s: %q: %v", filepath.Base(f), c.Name, args, err)
					}
				}
			}
		}
	}
	for _, want := range []string{"streamlimit enforcer", "streamlimit aggregator", "streamlimit topics ensure"} {
		if !commands[want] {
			t.Errorf("no container runs %s: %v", want, commands)
		}
	}
	t.Logf("%d containers' args parse, in %d files", n, len(files))
}
