package deploy_test

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// composeDoc returns docs/operations.md's section on the compose stack, with its
// subsections.
func composeDoc(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(b), "\n## Run it in two data centers (compose)\n")
	if !ok {
		t.Fatal("docs/operations.md has no compose section")
	}
	sec, _, _ = strings.Cut(sec, "\n## ")
	return sec
}

var (
	docName = regexp.MustCompile("`([a-z0-9-]+)`")
	docPort = regexp.MustCompile(`\b[1-9][0-9]{4}\b`)
)

// TestDocsComposeStack holds docs/operations.md's description of the compose stack to
// compose.yaml: its table names every service, and only those, with the host ports each
// row's services publish; the ports its commands reach on the host are published ports,
// and the services they name exist.
func TestDocsComposeStack(t *testing.T) {
	c := loadCompose(t)
	sec := composeDoc(t)
	named := map[string]bool{}
	for line := range strings.Lines(sec) {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		cells := strings.Split(strings.Trim(strings.TrimSpace(line), "|"), "|")
		var docPorts, ports []string
		for _, m := range docName.FindAllStringSubmatch(cells[0], -1) {
			sv, ok := c.Services[m[1]]
			if !ok {
				t.Errorf("docs/operations.md names the service %s, which compose.yaml lacks", m[1])
				continue
			}
			named[m[1]] = true
			for _, p := range sv.Ports {
				ports = append(ports, parsePort(t, m[1], p).port)
			}
		}
		docPorts = docPort.FindAllString(cells[len(cells)-1], -1)
		slices.Sort(ports)
		slices.Sort(docPorts)
		if !slices.Equal(ports, docPorts) {
			t.Errorf("docs/operations.md gives %s host ports %v; compose.yaml publishes %v", strings.TrimSpace(cells[0]), docPorts, ports)
		}
	}
	for name := range c.Services {
		if !named[name] {
			t.Errorf("docs/operations.md's table of the stack lacks %s", name)
		}
	}
	published := map[string]bool{}
	for name, sv := range c.Services {
		for _, p := range sv.Ports {
			published[parsePort(t, name, p).port] = true
		}
	}
	hostAddr := regexp.MustCompile(`(?:localhost|127\.0\.0\.1):([0-9]+)`)
	n := 0
	for _, blk := range strings.Split(sec, "```sh\n")[1:] {
		blk, _, _ = strings.Cut(blk, "```")
		for line := range strings.Lines(blk) {
			for _, m := range hostAddr.FindAllStringSubmatch(line, -1) {
				n++
				if !published[m[1]] {
					t.Errorf("docs/operations.md's command %q reaches port %s, which no service publishes", strings.TrimSpace(line), m[1])
				}
			}
			if rest, ok := strings.CutPrefix(line, "docker compose "); ok {
				f := strings.Fields(rest)
				for _, w := range f {
					if strings.Contains(w, "-") && !strings.HasPrefix(w, "-") && !strings.Contains(w, "=") {
						if _, ok := c.Services[w]; !ok {
							t.Errorf("docs/operations.md's command %q names %s, which compose.yaml lacks", strings.TrimSpace(line), w)
						}
					}
				}
				if slices.Contains(f, "logs") && !slices.ContainsFunc(f, func(w string) bool { _, ok := c.Services[w]; return ok }) {
					t.Errorf("docs/operations.md's command %q names no service", strings.TrimSpace(line))
				}
			}
		}
	}
	if n < 5 {
		t.Errorf("found %d host addresses in docs/operations.md's compose commands, want its curl and counts commands", n)
	}
}
