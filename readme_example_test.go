package streamlimit_test

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// The README's Go snippet is the body of Example, line for line, so that what a newcomer
// copies compiles and does what the README says.
func TestREADMEGoSnippetIsTheExample(t *testing.T) {
	snippetIsExample(t, "README.md", "### In a Go service", "func Example()")
}

// docs/api.md's middleware snippet is the body of ExampleLimiter_Middleware, line for line.
func TestAPIMiddlewareSnippetIsTheExample(t *testing.T) {
	snippetIsExample(t, "docs/api.md", "## In a Go service", "func ExampleLimiter_Middleware()")
}

// snippetIsExample checks that the first Go block after heading in doc is the body of the
// example function fn of example_test.go: each of its lines, in order, ignoring spacing.
func snippetIsExample(t *testing.T, doc, heading, fn string) {
	t.Helper()
	text, err := os.ReadFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)" + regexp.QuoteMeta(heading) + "\n.*?```go\n(.*?)```").FindSubmatch(text)
	if m == nil {
		t.Fatalf("%s has no Go snippet under %q", doc, heading)
	}
	example, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	_, from, ok := strings.Cut(string(example), fn)
	if !ok {
		t.Fatalf("example_test.go has no %s", fn)
	}
	from, _, _ = strings.Cut(from, "\n}\n")
	norm := func(s string) string { return strings.Join(strings.Fields(s), " ") }
	var body []string
	for _, l := range strings.Split(from, "\n") {
		body = append(body, norm(l))
	}
	at := 0
	for _, l := range strings.Split(strings.TrimSpace(string(m[1])), "\n") {
		want := norm(l)
		for at < len(body) && body[at] != want {
			at++
		}
		if at == len(body) {
			t.Fatalf("%s snippet line %q is not in %s (in this order)", doc, l, fn)
		}
	}
}

// maxREADMELines bounds the README: it is a newcomer's first hour (what it is, the demo,
// install, dev, one short path for each way to ask, links); reference belongs in docs/.
const maxREADMELines = 300

// TestREADMEIsShort holds the README to maxREADMELines.
func TestREADMEIsShort(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(readme), "\n"); n > maxREADMELines {
		t.Errorf("README.md has %d lines, want at most %d: move reference material to docs/", n, maxREADMELines)
	}
}

// TestREADMEFirstCommands keeps the README's first commands the demo and the test suite,
// each a real target: the demo a subcommand of the binary, make test a Makefile target.
func TestREADMEFirstCommands(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, block, ok := strings.Cut(string(readme), "```sh\n")
	if !ok {
		t.Fatal("README has no sh block")
	}
	block, _, _ = strings.Cut(block, "```")
	var cmds []string
	for l := range strings.Lines(block) {
		c, _, _ := strings.Cut(l, "#")
		cmds = append(cmds, strings.TrimSpace(c))
	}
	if want := []string{"go run ./cmd/streamlimit demo", "make test"}; !slices.Equal(cmds, want) {
		t.Errorf("README's first commands are %q, want %q", cmds, want)
	}
	mk, err := os.ReadFile("Makefile")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^test:`).Match(mk) {
		t.Error("the Makefile has no test target")
	}
	main, err := os.ReadFile("cmd/streamlimit/demo.go")
	if err != nil || !strings.Contains(string(main), `Use:   "demo`) {
		t.Errorf("cmd/streamlimit has no demo command (%v)", err)
	}
}

// TestREADMEInstall checks that the README installs from a clone (the module is not
// published, so an @latest install fails), and that its replace directive names this
// module's path, as go.mod does, and a directory holding cmd/streamlimit, a main package.
func TestREADMEInstall(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^go install ./cmd/streamlimit$`).Match(readme) {
		t.Error("README has no go install ./cmd/streamlimit")
	}
	if !strings.Contains(string(readme), "not published yet") {
		t.Error("README does not say the module is not published (so @latest fails)")
	}
	m := regexp.MustCompile(`(?m)^go mod edit -require=(\S+)@v0\.0\.0 -replace=(\S+)=\S+$`).FindSubmatch(readme)
	if m == nil {
		t.Fatal("README has no go mod edit -require=…@v0.0.0 -replace=…")
	}
	mod, err := os.ReadFile("go.mod")
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range m[1:] {
		if want := "module " + string(path) + "\n"; !strings.HasPrefix(string(mod), want) {
			t.Errorf("README's replace names %s, go.mod does not begin with %q", path, want)
		}
	}
	src, err := os.ReadFile("cmd/streamlimit/main.go")
	if err != nil || !regexp.MustCompile(`(?m)^package main$`).Match(src) {
		t.Errorf("cmd/streamlimit/main.go is not a main package (%v)", err)
	}
}

// TestREADMERulesAreTheExamples checks that the rules the README's examples use are the ones the
// Example runs with, so that its output (admitted, admitted, 429) is what they give.
func TestREADMERulesAreTheExamples(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, ask, ok := strings.Cut(string(readme), "\n## Ask it\n")
	if !ok {
		t.Fatal(`README has no "Ask it" section`)
	}
	_, rules, ok := strings.Cut(ask, "```yaml\n")
	if !ok {
		t.Fatal(`README's "Ask it" has no rules`)
	}
	rules, _, _ = strings.Cut(rules, "```")
	example, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(example), "`"+rules+"`") {
		t.Errorf("README's rules\n%s\nare not the Example's", rules)
	}
}
