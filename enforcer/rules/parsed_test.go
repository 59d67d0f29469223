package rules

import (
	"bytes"
	"cmp"
	"flag"
	"fmt"
	"go/ast"
	goparser "go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/parsed.golden from the current parser")

// repoRoot is the repository's root, seen from this package's directory.
const repoRoot = "../.."

// rulesSources returns every rules file of the repository and every rules example of its
// Markdown (a ```yaml block with a domain: line), keyed by a name relative to the
// repository's root ("README.md#3" for the third block of the README).
func rulesSources(t *testing.T) map[string][]byte {
	t.Helper()
	srcs := make(map[string][]byte)
	err := filepath.WalkDir(repoRoot, func(path string, de fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := de.Name()
		if de.IsDir() {
			if path != repoRoot && (strings.HasPrefix(name, ".") || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		rel, err := filepath.Rel(repoRoot, path)
		if err != nil {
			return err
		}
		switch {
		case strings.HasSuffix(name, ".yaml"), strings.HasSuffix(name, ".yml"):
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			if isRules(data) {
				srcs[filepath.ToSlash(rel)] = data
			}
		case strings.HasSuffix(name, ".md"):
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for i, block := range strings.Split(string(data), "```yaml\n")[1:] {
				body, _, _ := strings.Cut(block, "```")
				if isRules([]byte(body)) {
					srcs[fmt.Sprintf("%s#%d", filepath.ToSlash(rel), i+1)] = []byte(body)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return srcs
}

// isRules reports whether data looks like a rules file: a domain: key at the root.
func isRules(data []byte) bool {
	return bytes.HasPrefix(data, []byte("domain:")) || bytes.Contains(data, []byte("\ndomain:"))
}

// TestParsedGolden pins what the parser makes of every rules file and example in the
// repository, and of the broken files under testdata/broken: a stable dump of each parsed
// Config (descriptor tree, every field of every rule, limit and pool), or every error
// with its position, byte for byte. A change to the parser that changes any of them shows
// here as a diff; run with -update to accept one that is meant.
func TestParsedGolden(t *testing.T) {
	srcs := rulesSources(t)
	if len(srcs) < 30 {
		t.Fatalf("found %d rules sources, expected the repository's (testdata, deploy, README, …)", len(srcs))
	}
	names := make([]string, 0, len(srcs))
	for n := range srcs {
		names = append(names, n)
	}
	slices.Sort(names)
	var b strings.Builder
	for _, n := range names {
		fmt.Fprintf(&b, "=== %s\n", n)
		c, err := Parse(n, srcs[n])
		if err != nil {
			fmt.Fprintf(&b, "error:\n%v\n", err)
			continue
		}
		dumpConfig(&b, c)
	}
	got := b.String()
	p := filepath.Join("testdata", "parsed.golden")
	if *update {
		if err := os.WriteFile(p, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("%v (run go test -run TestParsedGolden -update to create it)", err)
	}
	if got != string(want) {
		gl, wl := strings.Split(got, "\n"), strings.Split(string(want), "\n")
		for i := 0; i < max(len(gl), len(wl)); i++ {
			var g, w string
			if i < len(gl) {
				g = gl[i]
			}
			if i < len(wl) {
				w = wl[i]
			}
			if g != w {
				t.Fatalf("parsed results differ from %s at line %d:\n got %s\nwant %s\n(run with -update if the change is meant)", p, i+1, g, w)
			}
		}
	}
}

// dumpConfig writes c in a stable order: domains by name, pools by name, the descriptor
// tree with exact entries by key and value and wildcards in configuration order.
func dumpConfig(b *strings.Builder, c *Config) {
	doms := c.Domains()
	slices.Sort(doms)
	for _, name := range doms {
		d := c.domains[name]
		fmt.Fprintf(b, "domain %q file %s", d.name, d.file)
		if d.compat != CompatNone {
			fmt.Fprintf(b, " compat %s", d.compat)
		}
		b.WriteString("\n")
		for _, pl := range c.Pools(name) {
			fmt.Fprintf(b, "  pool %q key %s at %s:%d priorities %v\n    ", pl.Name, pl.Key, pl.File, pl.Line, pl.Priorities)
			dumpLimit(b, &pl.Limit)
		}
		dumpNode(b, d.root, "  ")
	}
}

func dumpNode(b *strings.Builder, n *node, indent string) {
	if r := n.rule; r != nil {
		fmt.Fprintf(b, "%srule %s at %s:%d levels %+v unlimited=%v shadow=%v quota=%v detailed=%v value_to_metric=%v priority=%q replaces=%q\n",
			indent, r.ID, r.File, r.Line, r.Levels, r.Unlimited, r.ShadowMode, r.QuotaMode, r.DetailedMetric, r.ValueToMetric, r.Priority, r.replaces)
		for i := range r.Limits {
			b.WriteString(indent + "  ")
			dumpLimit(b, &r.Limits[i])
		}
	}
	entries := make([]Entry, 0, len(n.exact))
	for e := range n.exact {
		entries = append(entries, e)
	}
	slices.SortFunc(entries, func(a, b Entry) int {
		return cmp.Or(strings.Compare(a.Key, b.Key), strings.Compare(a.Value, b.Value))
	})
	for _, e := range entries {
		fmt.Fprintf(b, "%s%s=%q\n", indent, e.Key, e.Value)
		dumpNode(b, n.exact[e], indent+"  ")
	}
	for _, w := range n.wild {
		fmt.Fprintf(b, "%s%s~%q\n", indent, w.key, w.parts)
		dumpNode(b, w.n, indent+"  ")
	}
}

func dumpLimit(b *strings.Builder, l *Limit) {
	pool := "-"
	if l.Pool != nil {
		pool = l.Pool.Name
	}
	elastic := "-"
	if l.Elastic != nil {
		elastic = fmt.Sprintf("%+v", *l.Elastic)
	}
	fmt.Fprintf(b, "limit line %d name %q replaces %q requests %d window %v unit %q algorithm %s/%d calendar %v/%d scope %s soft %d burst %d hard %v pool %s/%q elastic %s tag %s\n",
		l.Line, l.Name, l.Replaces, l.Requests, l.Window, l.Unit, l.Algorithm, uint8(l.Algorithm), l.Calendar, uint8(l.Algorithm.Calendar()),
		l.Scope, l.SoftPercent, l.Burst, l.Hard, pool, l.pool, elastic, l.tag)
}

// TestRuleFieldDocs keeps the "new rule field" part of docs/architecture.md true to the
// parser: every name it gives in backquotes is a file, a directory, a declaration (or a
// struct field) of this package, and its command runs TestParsedGolden with -update.
func TestRuleFieldDocs(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(repoRoot, "docs", "architecture.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, _ := strings.Cut(string(doc), "- **A new rule field**")
	section, _, _ = strings.Cut(section, "- **A new record field**")
	if section == "" {
		t.Fatal(`docs/architecture.md has no "A new rule field" item`)
	}
	names := declaredNames(t)
	quoted := regexp.MustCompile("`([^`]+)`").FindAllStringSubmatch(section, -1)
	ident := regexp.MustCompile(`^[A-Za-z_]\w*(\.\w+)?$`)
	checked := 0
	for _, q := range quoted {
		s := q[1]
		switch {
		case strings.HasPrefix(s, "go test "):
			if !strings.Contains(s, " ./enforcer/rules ") || !strings.Contains(s, "-run TestParsedGolden") || !strings.HasSuffix(s, " -update") {
				t.Errorf("command %q does not run TestParsedGolden -update in enforcer/rules", s)
			}
		case strings.HasSuffix(s, ".go"), strings.HasSuffix(s, "/"), strings.Contains(s, "/"):
			if _, err := os.Stat(s); err != nil {
				if _, err2 := os.Stat(filepath.Join(repoRoot, s)); err2 != nil {
					if _, err3 := os.Stat(filepath.Join("testdata", s)); err3 != nil {
						t.Errorf("%q names no file or directory: %v", s, err)
					}
				}
			}
		case ident.MatchString(s):
			s = strings.TrimPrefix(s, "rules.")
			if !names[s] && !isDir(filepath.Join(repoRoot, "enforcer", s)) && !isDir(filepath.Join(repoRoot, s)) {
				t.Errorf("%q is not declared in package rules (nor a package)", s)
			}
		default:
			continue
		}
		checked++
	}
	if checked < 10 {
		t.Errorf("checked %d names of the section, expected the parser's tables and checks", checked)
	}
}

// declaredNames returns the top-level names of the package's Go files, and each struct
// field as "Type.Field".
func declaredNames(t *testing.T) map[string]bool {
	t.Helper()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	names := make(map[string]bool)
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := goparser.ParseFile(fset, f, nil, goparser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range af.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				names[d.Name.Name] = true
			case *ast.GenDecl:
				for _, sp := range d.Specs {
					switch sp := sp.(type) {
					case *ast.ValueSpec:
						for _, n := range sp.Names {
							names[n.Name] = true
						}
					case *ast.TypeSpec:
						names[sp.Name.Name] = true
						if st, ok := sp.Type.(*ast.StructType); ok {
							for _, fl := range st.Fields.List {
								for _, n := range fl.Names {
									names[sp.Name.Name+"."+n.Name] = true
								}
							}
						}
					}
				}
			}
		}
	}
	return names
}

func isDir(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}
