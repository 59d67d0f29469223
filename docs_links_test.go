package streamlimit_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

var (
	mdLink    = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	mdHeading = regexp.MustCompile("(?m)^#+ (.*)$")
)

// anchor is the fragment GitHub gives a Markdown heading: lower case, letters, digits,
// '_' and '-' kept, spaces made '-', everything else dropped.
func anchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case unicode.IsLetter(r), unicode.IsDigit(r), r == '_', r == '-':
			b.WriteRune(r)
		case r == ' ':
			b.WriteByte('-')
		}
	}
	return b.String()
}

// TestDocsLinks keeps the README's and docs/'s links to the repository's own files true:
// every relative link names a file that exists, and a #fragment a heading of that file, so
// that text moved between pages leaves no link behind.
func TestDocsLinks(t *testing.T) {
	docs, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]map[string]bool{}
	headings := func(file string) map[string]bool {
		if a, ok := anchors[file]; ok {
			return a
		}
		a := map[string]bool{}
		if b, err := os.ReadFile(file); err == nil {
			parts := strings.Split(string(b), "```")
			for i := 0; i < len(parts); i += 2 { // outside code blocks
				for _, m := range mdHeading.FindAllStringSubmatch(parts[i], -1) {
					a[anchor(m[1])] = true
				}
			}
		}
		anchors[file] = a
		return a
	}
	n := 0
	for _, name := range append([]string{"README.md"}, docs...) {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		parts := strings.Split(string(b), "```")
		for i := 0; i < len(parts); i += 2 {
			for _, m := range mdLink.FindAllStringSubmatch(parts[i], -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				n++
				path, frag, _ := strings.Cut(target, "#")
				file := name
				if path != "" {
					file = filepath.Join(filepath.Dir(name), path)
					if _, err := os.Stat(file); err != nil {
						t.Errorf("%s links to %s, which does not exist", name, target)
						continue
					}
				}
				if frag != "" && strings.HasSuffix(file, ".md") && !headings(file)[frag] {
					t.Errorf("%s links to %s: %s has no heading #%s", name, target, file, frag)
				}
			}
		}
	}
	if n < 50 {
		t.Fatalf("found %d links in README.md and docs/, want the many they have", n)
	}
}
