package rules

import (
	"fmt"
	"strings"

	"gopkg.in/yaml.v3"
)

// A descriptor is parsed as a rate_limit block is (limit.go): each field through its row
// of descriptorFields, then, in descriptor, the steps that need them all: the key, the
// place in the tree, the rule, the nested descriptors.

// descBlock is one descriptor being parsed.
type descBlock struct {
	lv     Level
	prefix string                // the descriptor's field path with a trailing '.'
	at     map[string]*yaml.Node // each field's value node, by field name

	shadow, quota, detail, valueToMetric, share bool
}

// descriptorFields are the fields of a descriptor, in the order that an unknown field's
// error lists them. rate_limit, rate_limits and descriptors are read from their nodes once
// the descriptor has its place in the tree.
var descriptorFields = []field[*descBlock]{
	{"key", func(p *parser, b *descBlock, v *yaml.Node, f string) { b.lv.Key, _ = p.str(v, f) }},
	{"value", func(p *parser, b *descBlock, v *yaml.Node, f string) { b.lv.Value, _ = p.str(v, f) }},
	{"rate_limit", nil},
	{"rate_limits", nil},
	{"descriptors", nil},
	{"shadow_mode", func(p *parser, b *descBlock, v *yaml.Node, f string) { b.shadow = p.boolean(v, f) }},
	{"quota_mode", func(p *parser, b *descBlock, v *yaml.Node, f string) { b.quota = p.boolean(v, f) }},
	{"detailed_metric", func(p *parser, b *descBlock, v *yaml.Node, f string) { b.detail = p.boolean(v, f) }},
	{"value_to_metric", func(p *parser, b *descBlock, v *yaml.Node, f string) { b.valueToMetric = p.boolean(v, f) }},
	{"share_threshold", func(p *parser, b *descBlock, v *yaml.Node, f string) { b.share = p.boolean(v, f) }},
	{"metadata", nil}, // free-form in envoyproxy/ratelimit; accepted and ignored
	{"priority", func(p *parser, b *descBlock, v *yaml.Node, f string) { b.lv.Priority, _ = p.str(v, f) }},
}

// descriptorFieldNames are the names of descriptorFields, in their order.
var descriptorFieldNames = fieldNames(descriptorFields)

func newNode() *node { return &node{exact: make(map[Entry]*node)} }

// descriptors parses a descriptors: list into the children of parent.
func (p *parser) descriptors(seq *yaml.Node, parent *node, d *Domain, path []Level, field string) {
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

// descriptor parses one descriptor under parent, whose path from the domain is path.
func (p *parser) descriptor(m *yaml.Node, parent *node, d *Domain, path []Level, prefix string) {
	b := &descBlock{prefix: prefix}
	b.at = envoyTable(p, m, prefix, descriptorFields, descriptorFieldNames, b)
	if m.Kind != yaml.MappingNode {
		return
	}
	if b.at["key"] == nil || b.lv.Key == "" {
		p.errorf(m, prefix+"key", "missing or empty (every descriptor needs a key)")
		return
	}
	p.descriptorWildcard(b)
	n := p.place(parent, b)
	if n == nil {
		return
	}
	path = append(path[:len(path):len(path)], b.lv)
	if b.at["rate_limit"] != nil || b.at["rate_limits"] != nil {
		n.rule = p.rule(b, d, path)
		p.rules = append(p.rules, n.rule)
	}
	if children := b.at["descriptors"]; children != nil {
		p.descriptors(children, n, d, path, prefix+"descriptors")
	}
}

// descriptorWildcard marks a value with '*' a wildcard, which share_threshold needs. In a
// CompatEnvoy domain only a value ending in '*' is one, a prefix, as envoyproxy/ratelimit
// matches it; another '*' stands for itself.
func (p *parser) descriptorWildcard(b *descBlock) {
	b.lv.Wildcard = strings.Contains(b.lv.Value, "*")
	if p.compat == CompatEnvoy {
		b.lv.Wildcard = strings.HasSuffix(b.lv.Value, "*")
	}
	if b.share && !b.lv.Wildcard {
		p.errorf(b.at["share_threshold"], b.prefix+"share_threshold", "needs a wildcard value (containing '*')")
	}
	b.lv.ShareThreshold = b.share && b.lv.Wildcard
}

// place adds the descriptor's node under parent and returns it, or reports a descriptor
// that parent already has and returns nil.
func (p *parser) place(parent *node, b *descBlock) *node {
	lv, n := &b.lv, newNode()
	if lv.Wildcard {
		for _, w := range parent.wild {
			if w.key == lv.Key && strings.Join(w.parts, "*") == lv.Value {
				p.errorf(b.at["value"], b.prefix+"value", "duplicate descriptor %s=%s at this level", lv.Key, lv.Value)
				return nil
			}
		}
		parts := strings.Split(lv.Value, "*")
		if p.compat == CompatEnvoy {
			parts = []string{strings.TrimSuffix(lv.Value, "*"), ""}
		}
		parent.wild = append(parent.wild, wildNode{key: lv.Key, parts: parts, n: n})
		return n
	}
	entry := Entry{Key: lv.Key, Value: lv.Value}
	if _, dup := parent.exact[entry]; dup {
		at := b.at["key"]
		if v := b.at["value"]; v != nil {
			at = v
		}
		p.errorf(at, b.prefix+"key", "duplicate descriptor %s at this level", describe(entry))
		return nil
	}
	parent.exact[entry] = n
	return n
}

// rule makes the Rule of a descriptor with rate_limit or rate_limits, at path.
func (p *parser) rule(b *descBlock, d *Domain, path []Level) *Rule {
	r := &Rule{Domain: d.name, File: p.file, Line: b.at["key"].Line, Levels: path,
		ShadowMode: b.shadow, QuotaMode: b.quota, DetailedMetric: b.detail, ValueToMetric: b.valueToMetric, Priority: nearestPriority(path)}
	r.ID = ruleID(d.name, path)
	rl, rls := b.at["rate_limit"], b.at["rate_limits"]
	switch {
	case rl != nil && rls != nil:
		p.errorf(rls, b.prefix+"rate_limits", "use either rate_limit or rate_limits, not both")
	case rl != nil:
		l, unlimited, ok := p.limit(rl, b.prefix+"rate_limit.", ruleLimit)
		if ok && unlimited {
			r.Unlimited, r.replaces = true, l.Replaces
		} else if ok {
			r.Limits = append(r.Limits, l)
		}
	default:
		p.limitList(rls, b.prefix+"rate_limits", r)
	}
	return r
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
