package streamlimit_test

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// The README's Go snippet is the body of Example, line for line, so that what a newcomer
// copies compiles and does what the README says.
func TestREADMEGoSnippetIsTheExample(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)### In a Go service\n\n```go\n(.*?)```").FindSubmatch(readme)
	if m == nil {
		t.Fatal("README has no Go snippet under \"In a Go service\"")
	}
	example, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	norm := func(s string) string { return strings.Join(strings.Fields(s), " ") }
	var body []string
	for _, l := range strings.Split(string(example), "\n") {
		body = append(body, norm(l))
	}
	at := 0
	for _, l := range strings.Split(strings.TrimSpace(string(m[1])), "\n") {
		want := norm(l)
		for at < len(body) && body[at] != want {
			at++
		}
		if at == len(body) {
			t.Fatalf("README snippet line %q is not in Example (in this order)", l)
		}
	}
}
