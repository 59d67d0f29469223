package rules

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/streamlimit/streamlimit/internal/safefile"
)

// Error is a problem in a rules file, with its position.
type Error struct {
	// File is the file's path as given to the loader.
	File string
	// Line and Column are 1-based; 0 when unknown (e.g. a file that cannot be read).
	Line, Column int
	// Field is the offending field, relative to its descriptor: "domain",
	// "descriptors[1].key", "rate_limit.unit", "rate_limits[0].window", …
	Field string
	// Reason says what is wrong.
	Reason string
	// Err is the error underneath Reason, when there is one (a file that could not be
	// read: fs.ErrNotExist, safefile.ErrNotRegular, safefile.ErrTooLarge), for errors.Is.
	Err error
}

// Unwrap returns e.Err.
func (e *Error) Unwrap() error { return e.Err }

// Error formats e as "file.yaml:12:5: rate_limit.unit: unknown unit "minutes" (want …)".
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d:%d", e.Line, e.Column)
	}
	b.WriteString(": ")
	if e.Field != "" {
		b.WriteString(e.Field)
		b.WriteString(": ")
	}
	b.WriteString(e.Reason)
	return b.String()
}

// maxErrors bounds how many errors one load reports.
const maxErrors = 20

// LoadFile loads one rules file. The error, if any, joins one *Error per problem found
// (errors.As finds the first).
func LoadFile(path string) (*Config, error) {
	src, err := readFile(path, LoadOptions{})
	if err != nil {
		return nil, err
	}
	return build([]source{src}, LoadOptions{})
}

// Parse loads one rules file's contents; name stands for the file in errors (e.g.
// "demo.yaml:4:5: ..."). It is LoadFile for rules that do not live on disk: embedded
// defaults, tests, configuration from elsewhere.
func Parse(name string, data []byte) (*Config, error) {
	return build([]source{{name: name, data: data}}, LoadOptions{})
}

// LoadDir loads every *.yaml and *.yml file directly in dir (not in subdirectories, and not
// dot files), one domain per file, as envoyproxy/ratelimit loads its runtime directory. Two
// files with the same domain are an error. An empty directory gives an empty Config.
func LoadDir(dir string) (*Config, error) {
	srcs, err := readDir(dir, LoadOptions{})
	if err != nil {
		return nil, err
	}
	return build(srcs, LoadOptions{})
}

// Load loads path with LoadDir if it is a directory, else with LoadFile.
func Load(path string) (*Config, error) {
	return LoadWith(path, LoadOptions{})
}

type source struct {
	name string
	data []byte
	// size and mtime are the file's as it was opened (zero for rules not read from a
	// file), which tell the reloader whether a file is still being written.
	size  int64
	mtime time.Time
}

// read reads path: every rules file of it if it is a directory, else the file.
func read(path string, opts LoadOptions) ([]source, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, &Error{File: path, Reason: err.Error(), Err: err}
	}
	if fi.IsDir() {
		return readDir(path, opts)
	}
	src, err := readFile(path, opts)
	if err != nil {
		return nil, err
	}
	return []source{src}, nil
}

// readFile reads one rules file, as every load and reload does: it refuses, without
// blocking or reading, a path that is not a regular file (a named pipe, /dev/zero) or a
// file larger than opts.MaxFileBytes, and never reads more than that (safefile.Read).
func readFile(path string, opts LoadOptions) (source, error) {
	limit := opts.maxFileBytes()
	data, fi, err := safefile.Read(path, limit)
	if err != nil {
		reason := err.Error()
		if errors.Is(err, safefile.ErrTooLarge) {
			reason += " (--rules-max-bytes)"
		}
		return source{}, &Error{File: path, Reason: reason, Err: err}
	}
	return source{name: path, data: data, size: fi.Size(), mtime: fi.ModTime()}, nil
}

func readDir(dir string, opts LoadOptions) ([]source, error) {
	des, err := os.ReadDir(dir)
	if err != nil {
		return nil, &Error{File: dir, Reason: err.Error(), Err: err}
	}
	var srcs []source
	for _, de := range des {
		name := de.Name()
		if de.IsDir() || strings.HasPrefix(name, ".") || !(strings.HasSuffix(name, ".yaml") || strings.HasSuffix(name, ".yml")) {
			continue
		}
		src, err := readFile(filepath.Join(dir, name), opts)
		if err != nil {
			return nil, err
		}
		srcs = append(srcs, src)
	}
	return srcs, nil
}

func build(srcs []source, opts LoadOptions) (*Config, error) {
	c := &Config{domains: make(map[string]*Domain)}
	var errs []error
	// Read every file first, so that each domain's Compat is known before any of its
	// files is parsed: with MergeDomains a file that does not say takes the one another
	// file of its domain says.
	roots := make([]*yaml.Node, len(srcs))
	compat := make(map[string]stated)
	for i, src := range srcs {
		var doc yaml.Node
		if err := yaml.Unmarshal(src.data, &doc); err != nil {
			errs = append(errs, yamlError(src.name, src.data, err))
			continue
		}
		if doc.Kind == 0 || len(doc.Content) == 0 {
			errs = append(errs, &Error{File: src.name, Field: "domain", Reason: "missing (the file is empty)"})
			continue
		}
		roots[i] = doc.Content[0]
		if st := preScan(roots[i]); st.compatSet {
			if prev, ok := compat[st.domain]; !ok || !prev.compatSet {
				compat[st.domain] = st
			}
		}
	}
	for i, src := range srcs {
		c.files = append(c.files, src.name)
		if roots[i] == nil {
			continue
		}
		p := &parser{file: src.name, compat: opts.Compat}
		name := preScan(roots[i]).domain
		if st, ok := compat[name]; ok {
			p.compat = st.compat
		}
		var into *Domain
		if opts.MergeDomains {
			into = c.domains[name] // nil for the domain's first file
		}
		d, domLine := p.file1(roots[i], into)
		errs = append(errs, p.errs...)
		if d == nil || into != nil {
			continue
		}
		if prev, ok := c.domains[d.name]; ok {
			errs = append(errs, &Error{File: src.name, Line: domLine.Line, Column: domLine.Column, Field: "domain",
				Reason: fmt.Sprintf("duplicate domain %q (also in %s)", d.name, prev.file)})
			continue
		}
		c.domains[d.name] = d
	}
	if len(errs) > 0 {
		if len(errs) > maxErrors {
			errs = errs[:maxErrors]
		}
		return nil, errors.Join(errs...)
	}
	return c, nil
}

type parser struct {
	file   string
	compat Compat // the Compat of the file's domain, which sets its limits' defaults
	errs   []error
	rules  []*Rule // the file's rules in the order they were parsed (the file's order)
}

func (p *parser) errorf(n *yaml.Node, field, format string, args ...any) {
	e := &Error{File: p.file, Field: field, Reason: fmt.Sprintf(format, args...)}
	if n != nil {
		e.Line, e.Column = n.Line, n.Column
	}
	p.errs = append(p.errs, e)
}

// envoyKeys are the keys that envoyproxy/ratelimit's validator accepts anywhere in a file:
// it checks key names, not where they stand, so its files may carry, for instance, a name
// on a descriptor. In the parts of a file that its format defines (the root, descriptors,
// rate_limit and replaces), such a key is accepted where it means nothing and ignored, so
// that its files load unchanged.
var envoyKeys = []string{"domain", "key", "value", "descriptors", "rate_limit", "unit", "requests_per_unit",
	"unlimited", "shadow_mode", "name", "replaces", "detailed_metric", "value_to_metric", "share_threshold", "quota_mode"}

// envoyFields is fields for the parts of a file that envoyproxy/ratelimit's format defines:
// a key of envoyKeys that is not known there is ignored instead of rejected.
func (p *parser) envoyFields(m *yaml.Node, prefix string, known []string, f func(key string, k, v *yaml.Node)) {
	p.fieldsTolerating(m, prefix, known, envoyKeys, f)
}

// fields iterates over a mapping node's key/value pairs, reporting unknown and duplicate
// keys. known lists the accepted keys.
func (p *parser) fields(m *yaml.Node, prefix string, known []string, f func(key string, k, v *yaml.Node)) {
	p.fieldsTolerating(m, prefix, known, nil, f)
}

// fieldsTolerating is fields that skips, without a word, the keys of tolerated that are
// not known.
func (p *parser) fieldsTolerating(m *yaml.Node, prefix string, known, tolerated []string, f func(key string, k, v *yaml.Node)) {
	if m.Kind != yaml.MappingNode {
		p.errorf(m, strings.TrimSuffix(prefix, "."), "want a mapping, got %s", kindName(m))
		return
	}
	seen := make(map[string]bool, len(m.Content)/2)
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := m.Content[i], m.Content[i+1]
		if !slices.Contains(known, k.Value) {
			if !slices.Contains(tolerated, k.Value) {
				p.errorf(k, prefix+k.Value, "unknown field (want one of %s)", strings.Join(known, ", "))
			}
			continue
		}
		if seen[k.Value] {
			p.errorf(k, prefix+k.Value, "duplicate field")
			continue
		}
		seen[k.Value] = true
		f(k.Value, k, v)
	}
}

// field is one field of a mapping that the parser knows, for the table of a block being
// built (a limit, a descriptor): its name, and how its value v goes into the block b (f
// is the field's path, for errors). parse is nil for a field whose node is read once every
// field has been (a nested block), or that is accepted and ignored.
type field[B any] struct {
	name  string
	parse func(p *parser, b B, v *yaml.Node, f string)
}

// fieldNames returns the names of table, in its order.
func fieldNames[B any](table []field[B]) []string {
	names := make([]string, len(table))
	for i, f := range table {
		names[i] = f.name
	}
	return names
}

// envoyTable is envoyFields over the fields of table (whose names are names): each field
// of m is parsed into b by its row, in the order of the file. It returns the value node
// of each field, by name.
func envoyTable[B any](p *parser, m *yaml.Node, prefix string, table []field[B], names []string, b B) map[string]*yaml.Node {
	at := make(map[string]*yaml.Node, len(table))
	p.envoyFields(m, prefix, names, func(key string, _, v *yaml.Node) {
		at[key] = v
		if f := table[slices.Index(names, key)]; f.parse != nil {
			f.parse(p, b, v, prefix+key)
		}
	})
	return at
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		return fmt.Sprintf("%q", n.Value)
	case yaml.AliasNode:
		return "an alias"
	}
	return "nothing"
}

func (p *parser) str(n *yaml.Node, field string) (string, bool) {
	if n.Kind != yaml.ScalarNode || n.Tag == "!!null" {
		p.errorf(n, field, "want a string, got %s", kindName(n))
		return "", false
	}
	return n.Value, true
}

func (p *parser) boolean(n *yaml.Node, field string) bool {
	var b bool
	if n.Kind != yaml.ScalarNode || n.Tag != "!!bool" || n.Decode(&b) != nil {
		p.errorf(n, field, "want true or false, got %s", kindName(n))
	}
	return b
}

func (p *parser) integer(n *yaml.Node, field string) (int64, bool) {
	if n.Kind != yaml.ScalarNode || n.Tag != "!!int" {
		p.errorf(n, field, "want an integer, got %s", kindName(n))
		return 0, false
	}
	v, err := strconv.ParseInt(n.Value, 0, 64)
	if err != nil {
		p.errorf(n, field, "want an integer, got %q", n.Value)
		return 0, false
	}
	return v, true
}

// rootFields are the fields at the root of a file. pools and descriptors are read from
// their nodes once every field has been: pools first, which the descriptors' limits name.
var rootFields = []field[*Domain]{
	{"domain", func(p *parser, d *Domain, v *yaml.Node, f string) {
		if s, ok := p.str(v, f); ok {
			if s == "" {
				p.errorf(v, f, "must not be empty")
			}
			d.name = s
		}
	}},
	{"descriptors", nil},
	{"pools", nil},
	{"compat", func(p *parser, d *Domain, v *yaml.Node, f string) {
		if s, ok := p.str(v, f); ok {
			c, err := ParseCompat(s)
			switch {
			case err != nil:
				p.errorf(v, f, "%v", err)
			case c != p.compat:
				// Another file of the domain (merged) said otherwise.
				p.errorf(v, f, "%s, where another file of the domain says %s", c, p.compat)
			}
		}
	}},
}

// rootFieldNames are the names of rootFields, in their order.
var rootFieldNames = fieldNames(rootFields)

// file1 parses the root of one file into a new domain, or into the domain into that
// earlier files configured (LoadOptions.MergeDomains), where its descriptors and pools
// join theirs. It returns the domain node for positions.
func (p *parser) file1(root *yaml.Node, into *Domain) (*Domain, *yaml.Node) {
	d := into
	if d == nil {
		d = &Domain{file: p.file, root: newNode(), compat: p.compat}
	}
	at := envoyTable(p, root, "", rootFields, rootFieldNames, d)
	if root.Kind != yaml.MappingNode {
		return nil, nil
	}
	if pools := at["pools"]; pools != nil {
		p.pools(pools, d)
	}
	if at["domain"] == nil {
		p.errorf(root, "domain", "missing")
	}
	if descs := at["descriptors"]; descs != nil {
		p.descriptors(descs, d.root, d, nil, "descriptors")
	}
	if len(p.errs) == 0 {
		p.resolvePools(d)
	}
	if len(p.errs) > 0 || d.name == "" {
		return nil, nil
	}
	return d, at["domain"]
}

// yamlError is the Error for a file that is not YAML, or not the YAML a rules file is.
func yamlError(file string, data []byte, err error) *Error {
	e := &Error{File: file, Reason: strings.TrimPrefix(err.Error(), "yaml: ")}
	var te *yaml.TypeError
	if errors.As(err, &te) {
		return e
	}
	// yaml.v3 reports syntax errors as "yaml: line N: …", where N is the line on which the
	// enclosing block began, not the offending line: keep the reason, and find the line
	// ourselves.
	if _, after, ok := strings.Cut(e.Reason, "line "); ok {
		if n, rest, ok := strings.Cut(after, ": "); ok {
			if _, err := strconv.Atoi(n); err == nil {
				e.Reason = rest
			}
		}
	}
	e.Line, e.Column = syntaxErrorAt(data)
	return e
}

// maxBisectLines bounds the files whose syntax errors syntaxErrorAt locates: it parses the
// file once per line, and rules files are far shorter than this.
const maxBisectLines = 5000

// syntaxErrorAt returns the line and column (1-based) of a YAML syntax error in data: the
// first non-blank character of the line after the longest prefix of whole lines that still
// parses. Every prefix that ends before the offending line parses (a block collection may
// end at any line, and a flow collection or quoted string that spans lines is only
// unparsable until it closes), and no prefix that includes it does. It returns 0, 0 when
// the file is too long to search or every prefix parses.
func syntaxErrorAt(data []byte) (line, column int) {
	lines := bytes.SplitAfter(data, []byte("\n"))
	if len(lines) > maxBisectLines {
		return 0, 0
	}
	good, end := 0, 0
	for i, l := range lines {
		end += len(l)
		var n yaml.Node
		if yaml.Unmarshal(data[:end], &n) == nil {
			good = i + 1
		}
	}
	if good >= len(lines) {
		return 0, 0
	}
	bad := lines[good]
	col := len(bad) - len(bytes.TrimLeft(bad, " \t"))
	if col == len(bad) {
		col = 0
	}
	return good + 1, col + 1
}
