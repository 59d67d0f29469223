package main

import (
	"go/build"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/streamlimit/streamlimit/internal/apisurface"
)

// outsideNames are backquoted names the docs give that are not Go names of this module nor
// of the standard library, each with why it is there. A name the test finds neither in the
// module nor here is a name the docs made up or kept after the code dropped it; an entry
// no doc uses any more fails the test too, so that the list stays short.
var outsideNames = map[string]string{
	"Forwarded":                "an HTTP header field (RFC 7239)",
	"Host":                     "an HTTP header field",
	"Origin":                   "an HTTP header field",
	"InvalidArgument":          "a gRPC status code",
	"Internal":                 "a gRPC status code",
	"Unknown":                  "a gRPC status code",
	"DeadlineExceeded":         "a gRPC status code",
	"Watch":                    "the gRPC health service's streaming method",
	"RateLimitRequest":         "Envoy's RLS request message",
	"RateLimitResponse":        "Envoy's RLS response message",
	"BucketId":                 "Envoy's RLQS bucket id message",
	"KafkaMirrorMaker2":        "Strimzi's MirrorMaker 2 resource kind",
	"DefaultReplicationPolicy": "Kafka MirrorMaker 2's topic naming policy class",
	"VmHWM":                    "a field of Linux's /proc/PID/status",
	"ControlKey":               "a method of franz-go's fake cluster (kfake.Cluster)",
	"SleepControl":             "a method of franz-go's fake cluster (kfake.Cluster)",
}

// outsidePackages are package qualifiers of other projects' Go packages the docs may name
// (`kgo.StickyKeyPartitioner`), whose names this test does not check, each with why.
var outsidePackages = map[string]string{
	"kgo":   "franz-go's Kafka client",
	"kadm":  "franz-go's Kafka admin client",
	"kfake": "franz-go's fake Kafka cluster",
	"kmsg":  "franz-go's Kafka protocol messages",
	"redis": "go-redis",
	"grpc":  "grpc-go",
	"codes": "grpc-go's status codes",
}

var (
	// A backquoted Go name: `Name`, `pkg.Name`, `Type.Field`, `pkg.Type.Field`, with an
	// optional () after it.
	goName = regexp.MustCompile(`^(?:[a-z][a-z0-9]*\.)?[A-Z][A-Za-z0-9_]*(?:\.[A-Z][A-Za-z0-9_]*)*(?:\(\))?$`)
	// A flag anywhere in a backquoted streamlimit command line, or at its start.
	spanFlag = regexp.MustCompile(`(?:^|\s)(--[a-z][a-z0-9-]*)`)
	span     = regexp.MustCompile("`([^`\n]+)`")
)

// moduleNames indexes the Go names declared in the module (test files included, since the
// docs name tests): every top-level name, every struct field and method as Type.Member,
// each also qualified by its package's name.
type moduleNames struct {
	bare      map[string]bool // Name, and every field and method name
	qualified map[string]bool // pkg.Name, Type.Member, pkg.Type.Member
	packages  map[string]bool // package names and last path elements
}

func indexModule(t *testing.T, root string) *moduleNames {
	t.Helper()
	m := &moduleNames{bare: map[string]bool{}, qualified: map[string]bool{}, packages: map[string]bool{}}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		pkg := strings.TrimSuffix(f.Name.Name, "_test")
		m.packages[pkg] = true
		m.packages[filepath.Base(filepath.Dir(path))] = true
		quals := []string{pkg, filepath.Base(filepath.Dir(path))}
		add := func(names ...string) { // names joined by "."
			n := strings.Join(names, ".")
			m.qualified[n] = true
			for _, q := range quals {
				m.qualified[q+"."+n] = true
			}
		}
		apisurface.Each(f.Decls, true, func(parts ...string) {
			m.bare[parts[len(parts)-1]] = true
			add(parts...)
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// stdNames answers whether the standard library's package named pkg (any of them, when
// several share the name) declares name at its top level.
type stdNames struct {
	dirs   map[string][]string // package name (last element) → directories
	parsed map[string]map[string]bool
}

func newStdNames(t *testing.T) *stdNames {
	t.Helper()
	s := &stdNames{dirs: map[string][]string{}, parsed: map[string]map[string]bool{}}
	src := filepath.Join(build.Default.GOROOT, "src")
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		name := d.Name()
		if path != src && (name == "testdata" || name == "internal" || name == "vendor" || name == "cmd") {
			return filepath.SkipDir
		}
		s.dirs[name] = append(s.dirs[name], path)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func (s *stdNames) has(pkg, name string) bool {
	for _, dir := range s.dirs[pkg] {
		names, ok := s.parsed[dir]
		if !ok {
			names = map[string]bool{}
			entries, _ := os.ReadDir(dir)
			for _, e := range entries {
				if e.IsDir() || !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
					continue
				}
				f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(dir, e.Name()), nil, parser.SkipObjectResolution)
				if err != nil {
					continue
				}
				apisurface.Each(f.Decls, true, func(parts ...string) { names[strings.Join(parts, ".")] = true })
			}
			s.parsed[dir] = names
		}
		if names[name] {
			return true
		}
	}
	return false
}

// TestDocsBackquotedNamesExist keeps the README's and docs/'s backquoted names true: every
// backquoted Go name (`Name`, `pkg.Name`, `Type.Field`) is declared in the module or the
// standard library, or listed in outsideNames or outsidePackages with why; and every flag
// in a backquoted streamlimit command line is a flag of some streamlimit command. A name
// renamed or dropped in the code then fails here until the docs follow.
func TestDocsBackquotedNamesExist(t *testing.T) {
	mod := indexModule(t, "../..")
	std := newStdNames(t)
	flags := map[string]bool{}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		c.Flags().VisitAll(func(f *pflag.Flag) { flags["--"+f.Name] = true })
		c.PersistentFlags().VisitAll(func(f *pflag.Flag) { flags["--"+f.Name] = true })
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(newRootCmd())

	docs, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	var missing []string
	used := map[string]bool{}
	for _, path := range append([]string{"../../README.md"}, docs...) {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		name := filepath.Base(path)
		parts := strings.Split(string(b), "```")
		for i := 0; i < len(parts); i += 2 { // outside code blocks
			for _, sm := range span.FindAllStringSubmatch(parts[i], -1) {
				s := sm[1]
				if strings.HasPrefix(s, "streamlimit ") || strings.HasPrefix(s, "--") {
					for _, fm := range spanFlag.FindAllStringSubmatch(s, -1) {
						f := fm[1]
						checked++
						if strings.HasSuffix(f, "-") { // a family: `--redis-tls-*`
							continue
						}
						if !flags[f] {
							missing = append(missing, name+": `"+s+"`: no command has "+f)
						}
					}
					continue
				}
				if !goName.MatchString(s) {
					continue
				}
				n := strings.TrimSuffix(s, "()")
				first, rest, qualified := strings.Cut(n, ".")
				if !qualified && strings.ToUpper(n) == n {
					continue // all capitals: a Redis command, an enum value, a signal
				}
				checked++
				switch {
				case !qualified:
					if outsideNames[n] != "" {
						used[n] = true
						continue
					}
					// A benchmark is named without its prefix, as go test prints it.
					if mod.bare[n] || mod.bare["Benchmark"+n] || std.has("builtin", n) {
						continue
					}
				case first[0] >= 'a' && first[0] <= 'z': // pkg.Name…
					if mod.packages[first] && mod.qualified[n] {
						continue
					}
					if outsidePackages[first] != "" {
						continue
					}
					if !mod.packages[first] && std.has(first, rest) {
						continue
					}
					// A variable of an example (`lim.Decide`): its member exists.
					if !mod.packages[first] && len(std.dirs[first]) == 0 && !strings.Contains(rest, ".") && mod.bare[rest] {
						continue
					}
				default: // Type.Member…
					if mod.qualified[n] {
						continue
					}
				}
				missing = append(missing, name+": `"+s+"`")
			}
		}
	}
	if checked < 500 {
		t.Fatalf("checked %d backquoted names and flags, want the many the docs have", checked)
	}
	for n := range outsideNames {
		if !used[n] {
			t.Errorf("outsideNames lists %s, which no doc names any more: take it out", n)
		}
	}
	sort.Strings(missing)
	for _, m := range missing {
		t.Errorf("%s names what is declared nowhere in the module or the standard library (list outside names in outsideNames with why)", m)
	}
}
