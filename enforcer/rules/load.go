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

	"gopkg.in/yaml.v3"
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
}

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
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, &Error{File: path, Reason: err.Error()}
	}
	return build([]source{{path, data}})
}

// Parse loads one rules file's contents; name stands for the file in errors (e.g.
// "demo.yaml:4:5: ..."). It is LoadFile for rules that do not live on disk: embedded
// defaults, tests, configuration from elsewhere.
func Parse(name string, data []byte) (*Config, error) {
	return build([]source{{name, data}})
}

// LoadDir loads every *.yaml and *.yml file directly in dir (not in subdirectories, and not
// dot files), one domain per file, as envoyproxy/ratelimit loads its runtime directory. Two
// files with the same domain are an error. An empty directory gives an empty Config.
func LoadDir(dir string) (*Config, error) {
	srcs, err := readDir(dir)
	if err != nil {
		return nil, err
	}
	return build(srcs)
}

// Load loads path with LoadDir if it is a directory, else with LoadFile.
func Load(path string) (*Config, error) {
	srcs, err := read(path)
	if err != nil {
		return nil, err
	}
	return build(srcs)
}

type source struct {
	name string
	data []byte
}

func read(path string) ([]source, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, &Error{File: path, Reason: err.Error()}
	}
	if fi.IsDir() {
		return readDir(path)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, &Error{File: path, Reason: err.Error()}
	}
	return []source{{path, data}}, nil
}

func readDir(dir string) ([]source, error) {
	des, err := os.ReadDir(dir)
	if err != nil {
		return nil, &Error{File: dir, Reason: err.Error()}
	}
	var srcs []source
	for _, de := range des {
		name := de.Name()
		if de.IsDir() || strings.HasPrefix(name, ".") || !(strings.HasSuffix(name, ".yaml") || strings.HasSuffix(name, ".yml")) {
			continue
		}
		p := filepath.Join(dir, name)
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, &Error{File: p, Reason: err.Error()}
		}
		srcs = append(srcs, source{p, data})
	}
	return srcs, nil
}

func build(srcs []source) (*Config, error) {
	c := &Config{domains: make(map[string]*domain)}
	var errs []error
	for _, src := range srcs {
		p := &parser{file: src.name}
		d, domLine := p.file1(src.data)
		errs = append(errs, p.errs...)
		c.files = append(c.files, src.name)
		if d == nil {
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
	file  string
	errs  []error
	rules []*Rule // the file's rules in the order they were parsed (the file's order)
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

// file1 parses one file into a domain, returning the domain node for positions.
func (p *parser) file1(data []byte) (*domain, *yaml.Node) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		e := &Error{File: p.file, Reason: strings.TrimPrefix(err.Error(), "yaml: ")}
		var te *yaml.TypeError
		if !errors.As(err, &te) {
			// yaml.v3 reports syntax errors as "yaml: line N: …", where N is the line on
			// which the enclosing block began, not the offending line: keep the reason,
			// and find the line ourselves.
			if _, after, ok := strings.Cut(e.Reason, "line "); ok {
				if n, rest, ok := strings.Cut(after, ": "); ok {
					if _, err := strconv.Atoi(n); err == nil {
						e.Reason = rest
					}
				}
			}
			e.Line, e.Column = syntaxErrorAt(data)
		}
		p.errs = append(p.errs, e)
		return nil, nil
	}
	if doc.Kind == 0 || len(doc.Content) == 0 {
		p.errorf(nil, "domain", "missing (the file is empty)")
		return nil, nil
	}
	root := doc.Content[0]
	d := &domain{file: p.file, root: newNode()}
	var domNode, descs, pools *yaml.Node
	p.envoyFields(root, "", []string{"domain", "descriptors", "pools"}, func(key string, k, v *yaml.Node) {
		switch key {
		case "domain":
			if s, ok := p.str(v, "domain"); ok {
				if s == "" {
					p.errorf(v, "domain", "must not be empty")
				}
				d.name = s
			}
			domNode = v
		case "descriptors":
			descs = v
		case "pools":
			pools = v
		}
	})
	if root.Kind != yaml.MappingNode {
		return nil, nil
	}
	if pools != nil {
		p.pools(pools, d)
	}
	if domNode == nil {
		p.errorf(root, "domain", "missing")
	}
	if descs != nil {
		p.descriptors(descs, d.root, d, nil, "descriptors")
	}
	if len(p.errs) == 0 {
		p.resolvePools(d)
	}
	if len(p.errs) > 0 || d.name == "" {
		return nil, nil
	}
	return d, domNode
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

func newNode() *node { return &node{exact: make(map[Entry]*node)} }

var descriptorFields = []string{"key", "value", "rate_limit", "rate_limits", "descriptors", "shadow_mode",
	"quota_mode", "detailed_metric", "value_to_metric", "share_threshold", "metadata", "priority"}

func (p *parser) descriptors(seq *yaml.Node, parent *node, d *domain, path []Level, field string) {
	if seq.Kind != yaml.SequenceNode {
		if seq.Tag != "!!null" {
			p.errorf(seq, field, "want a list, got %s", kindName(seq))
		}
		return
	}
	for i, item := range seq.Content {
		p.descriptor(item, parent, d, path, fmt.Sprintf("%s[%d].", field, i))
	}
}

func (p *parser) descriptor(m *yaml.Node, parent *node, d *domain, path []Level, prefix string) {
	var (
		lv                    Level
		keyNode, valNode      *yaml.Node
		rl, rls, children     *yaml.Node
		shadow, quota, detail bool
		valueToMetric, share  bool
		shareNode             *yaml.Node
	)
	p.envoyFields(m, prefix, descriptorFields, func(key string, k, v *yaml.Node) {
		switch key {
		case "key":
			keyNode = v
			lv.Key, _ = p.str(v, prefix+key)
		case "value":
			valNode = v
			lv.Value, _ = p.str(v, prefix+key)
		case "rate_limit":
			rl = v
		case "rate_limits":
			rls = v
		case "descriptors":
			children = v
		case "shadow_mode":
			shadow = p.boolean(v, prefix+key)
		case "quota_mode":
			quota = p.boolean(v, prefix+key)
		case "detailed_metric":
			detail = p.boolean(v, prefix+key)
		case "value_to_metric":
			valueToMetric = p.boolean(v, prefix+key)
		case "share_threshold":
			share, shareNode = p.boolean(v, prefix+key), v
		case "metadata":
			// Free-form in envoyproxy/ratelimit; accepted and ignored.
		case "priority":
			lv.Priority, _ = p.str(v, prefix+key)
		}
	})
	if m.Kind != yaml.MappingNode {
		return
	}
	if keyNode == nil || lv.Key == "" {
		p.errorf(m, prefix+"key", "missing or empty (every descriptor needs a key)")
		return
	}
	lv.Wildcard = strings.Contains(lv.Value, "*")
	if share && !lv.Wildcard {
		p.errorf(shareNode, prefix+"share_threshold", "needs a wildcard value (containing '*')")
	}
	lv.ShareThreshold = share && lv.Wildcard
	n := newNode()
	entry := Entry{Key: lv.Key, Value: lv.Value}
	if lv.Wildcard {
		for _, w := range parent.wild {
			if w.key == lv.Key && strings.Join(w.parts, "*") == lv.Value {
				p.errorf(valNode, prefix+"value", "duplicate descriptor %s=%s at this level", lv.Key, lv.Value)
				return
			}
		}
		parent.wild = append(parent.wild, wildNode{key: lv.Key, parts: strings.Split(lv.Value, "*"), n: n})
	} else {
		if _, dup := parent.exact[entry]; dup {
			at := keyNode
			if valNode != nil {
				at = valNode
			}
			p.errorf(at, prefix+"key", "duplicate descriptor %s at this level", describe(entry))
			return
		}
		parent.exact[entry] = n
	}
	path = append(path[:len(path):len(path)], lv)

	if rl != nil || rls != nil {
		r := &Rule{Domain: d.name, File: p.file, Line: keyNode.Line, Levels: path,
			ShadowMode: shadow, QuotaMode: quota, DetailedMetric: detail, ValueToMetric: valueToMetric, Priority: nearestPriority(path)}
		r.ID = ruleID(d.name, path)
		switch {
		case rl != nil && rls != nil:
			p.errorf(rls, prefix+"rate_limits", "use either rate_limit or rate_limits, not both")
		case rl != nil:
			l, unlimited, ok := p.limit(rl, prefix+"rate_limit.", true)
			if ok && unlimited {
				r.Unlimited, r.replaces = true, l.Replaces
			} else if ok {
				r.Limits = append(r.Limits, l)
			}
		default:
			p.limitList(rls, prefix+"rate_limits", r)
		}
		n.rule = r
		p.rules = append(p.rules, r)
	}
	if children != nil {
		p.descriptors(children, n, d, path, prefix+"descriptors")
	}
}

// nearestPriority returns the priority of the deepest level of path that has one.
func nearestPriority(path []Level) string {
	for i := len(path) - 1; i >= 0; i-- {
		if path[i].Priority != "" {
			return path[i].Priority
		}
	}
	return ""
}

func describe(e Entry) string {
	if e.Value == "" {
		return e.Key + " (no value)"
	}
	return e.Key + "=" + e.Value
}

func ruleID(domainName string, path []Level) string {
	var b strings.Builder
	b.WriteString(domainName)
	for _, l := range path {
		b.WriteByte('.')
		b.WriteString(l.Key)
		if l.Value != "" {
			b.WriteByte('_')
			b.WriteString(l.Value)
		}
	}
	return b.String()
}
