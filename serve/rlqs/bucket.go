package rlqs

import (
	"slices"
	"sort"
	"strings"

	"github.com/streamlimit/streamlimit/enforcer/rules"
)

// Mapper turns bucket ids into descriptors of the rules: the bucket id is a map without an
// order, a descriptor a list of entries in the order of the rules' nesting, so the order
// comes from the rules (see Descriptors). A Mapper is made for one rules Config.
type Mapper struct {
	domains map[string]*keyNode
}

// keyNode is one level of a domain's descriptor keys: the keys nested below it, and
// whether a rule ends at it.
type keyNode struct {
	next map[string]*keyNode
	rule bool
}

// NewMapper returns the Mapper of cfg's domains.
func NewMapper(cfg *rules.Config) *Mapper {
	m := &Mapper{domains: map[string]*keyNode{}}
	if cfg == nil {
		return m
	}
	for _, r := range cfg.Rules() {
		n := m.domains[r.Domain]
		if n == nil {
			n = &keyNode{}
			m.domains[r.Domain] = n
		}
		for _, lv := range r.Levels {
			if n.next == nil {
				n.next = map[string]*keyNode{}
			}
			c := n.next[lv.Key]
			if c == nil {
				c = &keyNode{}
				n.next[lv.Key] = c
			}
			n = c
		}
		n.rule = true
	}
	return m
}

// Descriptors maps a bucket id of domain to descriptors: each descriptor is the longest
// chain of the bucket's keys that the domain's rules nest (a key at the top of a rules
// file, then a key of a descriptor nested in it, and so on) and that ends where a rule
// does, with the bucket's values; ties go to the chain whose keys sort first. Its keys are
// taken out and the next descriptor is looked for among the rest, until none is found.
// Keys that end in no rule are left out: they name the bucket without limiting it. So
// {user: 42} is the descriptor [user=42], {plan: free, user: 42} under a rules file that
// nests user in plan is [plan=free, user=42], and {user: 42, api_key: k} under two rules
// at the top is two descriptors, [api_key=k] and [user=42], both of which must pass.
// Which rule then applies, values and wildcards included, is rules.Config.Match's to say.
func (m *Mapper) Descriptors(domain string, bucket map[string]string) [][]rules.Entry {
	root := m.domains[domain]
	if root == nil || len(bucket) == 0 {
		return nil
	}
	keys := make([]string, 0, len(bucket))
	for k := range bucket {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	used := make([]bool, len(keys))
	var out [][]rules.Entry
	for {
		best := longest(root, keys, used, nil)
		if len(best) == 0 {
			return out
		}
		d := make([]rules.Entry, len(best))
		for i, k := range best {
			d[i] = rules.Entry{Key: keys[k], Value: bucket[keys[k]]}
			used[k] = true
		}
		out = append(out, d)
	}
}

// longest returns the indexes (into keys, sorted) of the longest chain below n, from the
// keys not used, that ends at a rule: the first such chain in key order among the longest.
func longest(n *keyNode, keys []string, used []bool, path []int) []int {
	var best []int
	if n.rule && len(path) > 0 {
		best = slices.Clone(path)
	}
	for i, k := range keys {
		c := n.next[k]
		if used[i] || c == nil || slices.Contains(path, i) {
			continue
		}
		if p := longest(c, keys, used, append(path, i)); len(p) > len(best) {
			best = p
		}
	}
	return best
}

// canonical returns a bucket id as one string, the same for the same keys and values
// whatever the map's order: "key=value" pairs sorted by key and joined by "|", with the
// separators escaped as in counter keys.
func canonical(bucket map[string]string) string {
	keys := make([]string, 0, len(bucket))
	for k := range bucket {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteByte('|')
		}
		escape(&b, k)
		b.WriteByte('=')
		escape(&b, bucket[k])
	}
	return b.String()
}

func escape(b *strings.Builder, s string) {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '%':
			b.WriteString("%25")
		case '|':
			b.WriteString("%7C")
		case '=':
			b.WriteString("%3D")
		default:
			b.WriteByte(c)
		}
	}
}
