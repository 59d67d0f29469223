package rules

import (
	"fmt"
	"strconv"

	"gopkg.in/yaml.v3"

	"github.com/streamlimit/streamlimit/enforcer/algo"
)

// Compat says whose answers a domain gives: streamlimit's own (CompatNone, the default)
// or envoyproxy/ratelimit's (CompatEnvoy). A file says it with compat: at its root; a
// file that does not takes LoadOptions.Compat.
type Compat uint8

const (
	// CompatNone gives streamlimit's answers: limits default to global scope and sliding
	// windows, a denied request takes nothing from any limit, and the RateLimit header
	// fields are sent.
	CompatNone Compat = iota
	// CompatEnvoy gives envoyproxy/ratelimit's answers to a file written for it: a limit
	// that names no scope and no algorithm is its fixed window (aligned as its counters
	// are, its month 30 days and its year 365 days since the Unix epoch) counted in the
	// site's Redis, as its counters are, and the serving packages answer as it answers
	// (package rls). A limit that asks for streamlimit's extensions (another scope or
	// algorithm, a window, a pool, …) keeps them. Only the defaults of the limits differ
	// here: a global limit still defaults to sliding_window, the only way its counts
	// slide, and a pool's capacity is always global.
	CompatEnvoy
)

// DefaultCompat is the Compat of a domain whose file does not say and whose loader was
// given none.
const DefaultCompat = CompatNone

var compatNames = [...]string{CompatNone: "none", CompatEnvoy: "envoy"}

// String returns the name that compat: takes: "none" or "envoy".
func (c Compat) String() string {
	if int(c) < len(compatNames) {
		return compatNames[c]
	}
	return "Compat(" + strconv.Itoa(int(c)) + ")"
}

// ParseCompat returns the Compat named s: "none" or "envoy".
func ParseCompat(s string) (Compat, error) {
	for i, n := range compatNames {
		if n == s {
			return Compat(i), nil
		}
	}
	return 0, fmt.Errorf("unknown compat %q (want none or envoy)", s)
}

// LoadOptions say how files become a Config. The zero value loads as LoadFile and
// LoadDir do.
type LoadOptions struct {
	// Compat is the Compat of a domain whose files do not say. Default DefaultCompat.
	Compat Compat
	// MergeDomains lets several files configure one domain, as envoyproxy/ratelimit's
	// MERGE_DOMAIN_CONFIG does: their descriptors and pools are put together, and a
	// descriptor (or pool) that two of them define at the same place is an error at the
	// later file. Each file is parsed on its own, so a limit names a pool of its own file.
	// Default false: a domain in two files is an error.
	MergeDomains bool
	// MaxFileBytes bounds each rules file: a larger one is refused before it is read, and
	// none is read past it, so that a path swapped to a huge or endless file cannot take
	// the enforcer's memory. Default (0): DefaultMaxFileBytes; negative: no bound.
	MaxFileBytes int64
}

// DefaultMaxFileBytes is LoadOptions.MaxFileBytes when zero: far more than any rules file
// needs (a descriptor is some tens of bytes), far less than what would strain a process.
const DefaultMaxFileBytes = 16 << 20

func (o LoadOptions) maxFileBytes() int64 {
	if o.MaxFileBytes == 0 {
		return DefaultMaxFileBytes
	}
	return o.MaxFileBytes
}

// LoadWith loads path (a file, or a directory as LoadDir) with opts.
func LoadWith(path string, opts LoadOptions) (*Config, error) {
	srcs, err := read(path, opts)
	if err != nil {
		return nil, err
	}
	return build(srcs, opts)
}

// ParseWith is Parse with opts.
func ParseWith(name string, data []byte, opts LoadOptions) (*Config, error) {
	return build([]source{{name: name, data: data}}, opts)
}

// Compat returns domain's Compat, and false when c does not configure domain.
func (c *Config) Compat(domain string) (Compat, bool) {
	if c == nil {
		return DefaultCompat, false
	}
	d := c.domains[domain]
	if d == nil {
		return DefaultCompat, false
	}
	return d.compat, true
}

// stated is what the root of one file says of its domain before it is parsed: its name
// and compat:, so that every file of a merged domain is parsed with the domain's Compat.
type stated struct {
	domain    string
	compat    Compat
	compatSet bool
}

// preScan reads the domain and compat fields of a file's root, ignoring anything it
// cannot read (the parse reports it).
func preScan(root *yaml.Node) stated {
	var st stated
	if root == nil || root.Kind != yaml.MappingNode {
		return st
	}
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		if v.Kind != yaml.ScalarNode {
			continue
		}
		switch k.Value {
		case "domain":
			st.domain = v.Value
		case "compat":
			if c, err := ParseCompat(v.Value); err == nil {
				st.compat, st.compatSet = c, true
			}
		}
	}
	return st
}

// compatDefaults gives a limit of a CompatEnvoy domain envoyproxy/ratelimit's defaults
// for what it does not name: site scope and, outside global scope, a fixed window. A
// pool's capacity is left global.
func (p *parser) compatDefaults(b *limitBlock, kind limitKind) {
	if p.compat != CompatEnvoy || kind == poolLimit {
		return
	}
	if !b.set("scope") {
		b.l.Scope = Site
	}
	if !b.set("algorithm") && b.l.Scope != Global {
		b.l.Algorithm = algo.FixedWindow
	}
}
