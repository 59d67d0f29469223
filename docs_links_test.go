package streamlimit_test

import (
	"fmt"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
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

// maxPackageDocLines bounds the package comments of the whole module together. A package
// comment says what the package provides and how to use it, and links to the doc in docs/
// that explains the concept; the concept itself lives in docs/, in one place.
const maxPackageDocLines = 400

// TestPackageDocsShort counts the lines of every package comment of the module (the doc
// comment on the package clause of each non-test Go file) and fails above
// maxPackageDocLines, naming the longest, so that a model written into a package comment
// goes to docs/ instead.
func TestPackageDocsShort(t *testing.T) {
	type doc struct {
		file  string
		lines int
	}
	var docs []doc
	total := 0
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path != "." && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.PackageClauseOnly|parser.ParseComments)
		if err != nil {
			return err
		}
		if f.Doc == nil {
			return nil
		}
		n := 0
		for _, c := range f.Doc.List {
			n += strings.Count(c.Text, "\n") + 1
		}
		docs = append(docs, doc{path, n})
		total += n
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(docs) < 30 {
		t.Fatalf("found %d package comments, want one for each of the module's many packages", len(docs))
	}
	if total > maxPackageDocLines {
		sort.Slice(docs, func(i, j int) bool { return docs[i].lines > docs[j].lines })
		var longest []string
		for _, d := range docs[:min(5, len(docs))] {
			longest = append(longest, fmt.Sprintf("%s %d", d.file, d.lines))
		}
		t.Errorf("package comments total %d lines, want at most %d: move what explains a concept to docs/ and link it (longest: %s)",
			total, maxPackageDocLines, strings.Join(longest, ", "))
	}
}
