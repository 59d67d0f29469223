package streamlimit_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/streamlimit/streamlimit/internal/testenv"
)

// readmeInstallCommands returns the command lines of the sh blocks of the README's
// Install section.
func readmeInstallCommands(t *testing.T) []string {
	t.Helper()
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(readme), "\n## Install\n")
	if !ok {
		t.Fatal("README has no Install section")
	}
	sec, _, _ = strings.Cut(sec, "\n## ")
	var lines []string
	for _, blk := range strings.Split(sec, "```sh\n")[1:] {
		blk, _, _ = strings.Cut(blk, "```")
		for line := range strings.Lines(blk) {
			if line = strings.TrimSpace(line); line != "" {
				lines = append(lines, line)
			}
		}
	}
	return lines
}

// TestREADMEInstallCommands runs the README's Install commands: each go install, into a
// temporary GOBIN, then the installed binary's version (the one -ldflags stamps, when it
// does); and the library's replace directive in a new module next to a directory named as
// the README names the clone, whose program is the README's Go snippet.
//
// It needs no network: GOPROXY=off, the module cache that the repository's own build
// filled, and the repository's go.sum for the checksums. In place of the README's go mod
// tidy, which also resolves the tests of the dependencies and so needs the module proxy
// for modules that no build here downloads, it builds with -mod=mod, which adds the
// requirements the program needs to go.mod as tidy would.
func TestREADMEInstallCommands(t *testing.T) {
	testenv.RealParts(t)
	repo, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	lines := readmeInstallCommands(t)
	gobin := t.TempDir()
	run := func(dir string, env []string, name string, args ...string) string {
		t.Helper()
		cmd := exec.Command(name, args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), env...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %q in %s: %v\n%s", name, args, dir, err, out)
		}
		return string(out)
	}
	installs, edits := 0, 0
	for _, line := range lines {
		switch {
		case strings.HasPrefix(line, "go install "):
			installs++
			run(repo, []string{"GOBIN=" + gobin}, "bash", "-c", line)
			got := run(repo, nil, filepath.Join(gobin, "streamlimit"), "version")
			want := "streamlimit "
			if strings.Contains(line, "main.version=$(git describe --tags --always --dirty)") {
				want += run(repo, nil, "git", "describe", "--tags", "--always", "--dirty")
			}
			if !strings.HasPrefix(got, want) || len(got) <= len("streamlimit \n") {
				t.Errorf("after %s: streamlimit version printed %q, want %q", line, got, want)
			}
		case strings.HasPrefix(line, "go mod edit "):
			edits++
			libraryFromAnotherModule(t, repo, line, run)
		case line == "go mod tidy":
			// Done by the build of libraryFromAnotherModule (see above).
		default:
			t.Errorf("README's Install runs %q, which this test does not", line)
		}
	}
	if installs != 2 || edits != 1 {
		t.Errorf("README's Install has %d go install and %d go mod edit commands, want 2 and 1", installs, edits)
	}
}

// libraryFromAnotherModule makes a module whose program is the README's Go snippet, next
// to the clone as the README's edit names it (a link to this repository), runs edit in it,
// builds it without the network and runs it.
func libraryFromAnotherModule(t *testing.T, repo, edit string, run func(string, []string, string, ...string) string) {
	t.Helper()
	m := regexp.MustCompile(`-replace=\S+=(\.\./[^/\s]+)$`).FindStringSubmatch(edit)
	if m == nil {
		t.Fatalf("%s: want -replace=MODULE=../DIR", edit)
	}
	top := t.TempDir()
	dir := filepath.Join(top, "useit")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(repo, filepath.Join(dir, m[1])); err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	snip := regexp.MustCompile("(?s)### In a Go service\n.*?```go\n(.*?)```").FindSubmatch(readme)
	if snip == nil {
		t.Fatal("README has no Go snippet under \"### In a Go service\"")
	}
	prog := "package main\n\nimport (\n\t\"context\"\n\t\"fmt\"\n\t\"log\"\n\n\t\"github.com/streamlimit/streamlimit\"\n)\n\n" +
		"func main() {\n\tctx := context.Background()\n" + string(snip[1]) + "}\n"
	sum, err := os.ReadFile("go.sum")
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string]string{
		"main.go":    prog,
		"go.sum":     string(sum),
		"rules.yaml": "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 2}\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(b), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	offline := []string{"GOPROXY=off", "GOFLAGS=-mod=mod", "GOWORK=off"}
	run(dir, offline, "go", "mod", "init", "example.com/useit")
	run(dir, offline, "bash", "-c", edit)
	run(dir, offline, "go", "build", "-o", "useit", ".")
	cmd := exec.Command(filepath.Join(dir, "useit"))
	cmd.Dir = dir
	out, err := cmd.Output() // what it logs goes to stderr
	if want := "admitted\nadmitted\n429\n"; err != nil || string(out) != want {
		t.Errorf("the README's snippet from another module printed %q (%v), want %q", out, err, want)
	}
}
