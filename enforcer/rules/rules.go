// Package rules loads rate-limit rules from YAML and matches request descriptors to them.
//
// The format is a superset of envoyproxy/ratelimit's (domain, nested descriptors with key
// and optional value, rate_limit with unit and requests_per_unit, name, replaces,
// unlimited, shadow_mode, detailed_metric, …), so its files load unchanged and match the
// same way. streamlimit adds, on a limit: window (any duration, "3h", "7d"), algorithm,
// scope, soft_percent, burst and align; and on a descriptor, rate_limits: a list of limits that
// must all pass. See Limit for the fields, defaults and checks.
//
// A Config is immutable once loaded and safe for simultaneous use; a Reloader swaps in a
// new one when the files change and keeps the last good one when an edit is broken.
package rules

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/streamlimit/streamlimit/enforcer/algo"
	"github.com/streamlimit/streamlimit/internal/exact"
	"github.com/streamlimit/streamlimit/topics"
)

// Scope says which enforcers share a limit's count.
type Scope uint8

const (
	// Global counts across all sites through the Kafka pipeline. It is the
	// default scope, since enforcing globally is the product's point; it supports the
	// sliding_window, token_bucket and gcra algorithms (the buckets counted as at most
	// their burst in any burst / rate).
	Global Scope = iota
	// Site counts across the enforcers that share one DC's Redis.
	Site
	// Local counts in this process alone.
	Local
)

// DefaultScope is the scope of a limit that names none.
const DefaultScope = Global

// DefaultAlgorithm is the algorithm of a limit that names none, in every scope. Unlike
// envoyproxy/ratelimit's fixed window it does not let 2× the limit through around a window
// boundary; write algorithm: fixed_window to get envoyproxy/ratelimit's exact behaviour.
const DefaultAlgorithm = algo.SlidingWindow

var scopeNames = [...]string{Global: "global", Site: "site", Local: "local"}

// String returns the configuration name of s.
func (s Scope) String() string {
	if int(s) < len(scopeNames) {
		return scopeNames[s]
	}
	return "Scope(" + strconv.Itoa(int(s)) + ")"
}

// ParseScope returns the Scope named s ("local", "site" or "global").
func ParseScope(s string) (Scope, error) {
	for i, n := range scopeNames {
		if n == s {
			return Scope(i), nil
		}
	}
	return 0, fmt.Errorf("unknown scope %q", s)
}

// Entry is one (key, value) pair of a request descriptor, as in Envoy's
// RateLimitDescriptor.Entry.
type Entry struct {
	Key   string
	Value string
}

// Limit is one limit of a Rule, from a rate_limit block or one item of rate_limits.
type Limit struct {
	// Name is rate_limit.name, the handle that replaces refers to; may be empty.
	Name string
	// Replaces lists the names of limits that this one replaces when both match in one
	// request (envoyproxy/ratelimit's replaces).
	Replaces []string
	// Requests is requests_per_unit: requests admitted per Window; 0 admits nothing.
	Requests int64
	// Window is the period: window, or the duration of unit (second, minute, hour, day,
	// week = 7 days, month = 30 days, year = 365 days, as envoyproxy/ratelimit counts them).
	Window time.Duration
	// Unit is the unit as written, or "" when only window was given.
	Unit string
	// Algorithm defaults to DefaultAlgorithm.
	Algorithm algo.Algorithm
	// Scope defaults to DefaultScope.
	Scope Scope
	// Calendar (align: calendar) makes the limit a fixed window that starts at its unit's
	// calendar boundary in UTC and resets there, as envoyproxy/ratelimit's counters do: a
	// calendar month or year for unit month or year (Algorithm is then
	// algo.FixedWindowOn(algo.Month) or (algo.Year)), else a multiple of Window since the
	// Unix epoch (for a second, minute, hour or day, the calendar's boundaries; Algorithm
	// is algo.FixedWindow). Only in local or site scope.
	Calendar bool
	// SoftPercent makes the limit soft: 10 admits 110% (see algo.Limit).
	SoftPercent int
	// Burst is the bucket capacity of token_bucket, leaky_bucket and gcra; 0 means
	// Requests.
	Burst int64
	// Hard makes a global limit count its own site's oldest sub-bucket whole until it has
	// left the window, so that one site never admits more than the limit in any window
	// (for limits that must never be exceeded: one-time passwords, payments), at the price
	// of up to one sub-bucket's requests.
	Hard bool
	// Pool is the pool every request this limit admits also counts toward (pool: NAME),
	// or nil.
	Pool *Pool
	// Elastic lets the limit rise above Requests while Pool has room, or is nil.
	Elastic *Elastic
	// Line is where the limit is defined in Rule.File.
	Line int

	tag  string // window part of the counter key, e.g. "60s"
	pool string // pool: as written, resolved into Pool once the domain is parsed
}

// Algo returns the limit in the form package algo takes.
func (l *Limit) Algo() algo.Limit {
	return algo.Limit{Requests: l.Requests, Window: l.Window, Burst: l.Burst, SoftPercent: l.SoftPercent}
}

// CountWindow is the sliding window a global limit is counted over, and GlobalAllowance
// the count it may reach in it. For sliding_window they are Window and the allowance. A
// global token_bucket or gcra of Requests per Window with capacity Burst is counted as a
// sliding window of Burst × Window / Requests holding at most Burst (soft raise included):
// bursts of the bucket's size are admitted, and in the long run no more than Requests per
// Window, as the bucket refills — here as its oldest requests leave the short window. It
// never admits more than the bucket in any interval, and may admit less (a full bucket
// that has just refilled allows Burst at once plus the refill of the following interval).
func (l *Limit) CountWindow() time.Duration {
	if l.Scope == Global && (l.Algorithm == algo.TokenBucket || l.Algorithm == algo.GCRA) && l.Requests > 0 {
		a := l.Algo()
		if q, _, ok := exact.MulDiv(uint64(a.Capacity()), uint64(l.Window), uint64(a.Allowance())); ok && q > 0 && q < 1<<62 {
			return time.Duration(q)
		}
	}
	return l.Window
}

// GlobalAllowance is the count a global limit may reach in its CountWindow.
func (l *Limit) GlobalAllowance() int64 {
	if l.Scope == Global && (l.Algorithm == algo.TokenBucket || l.Algorithm == algo.GCRA) && l.Requests > 0 {
		return l.Algo().Capacity()
	}
	return l.Algo().Allowance()
}

// CountAllowance is the count the limit admits in its counting window, soft raise
// included: GlobalAllowance in CountWindow for a global limit, else the algorithm's
// allowance per Window.
func (l *Limit) CountAllowance() int64 {
	if l.Scope == Global {
		return l.GlobalAllowance()
	}
	return l.Algo().Allowance()
}

// HardAllowance is CountAllowance without the soft raise: where the soft band begins. A
// soft limit admits up to CountAllowance; requests past HardAllowance are admitted in the
// soft band, and reported so (see enforcer.Status.Soft).
func (l *Limit) HardAllowance() int64 {
	h := *l
	h.SoftPercent = 0
	return h.CountAllowance()
}

// WindowTag is the window as it appears in counter keys: whole seconds as "60s", else
// whole milliseconds as "1500ms", else nanoseconds as "1500000001ns".
func (l *Limit) WindowTag() string { return l.tag }

func windowTag(d time.Duration) string {
	switch {
	case d%time.Second == 0:
		return strconv.FormatInt(int64(d/time.Second), 10) + "s"
	case d%time.Millisecond == 0:
		return strconv.FormatInt(int64(d/time.Millisecond), 10) + "ms"
	default:
		return strconv.FormatInt(int64(d), 10) + "ns"
	}
}

// Level is one level of a rule's descriptor path.
type Level struct {
	Key string
	// Value is the configured value: "" matches any value (one counter per distinct
	// value), a value with '*' is a wildcard (each '*' matches any run of characters),
	// anything else matches exactly.
	Value string
	// Wildcard reports that Value contains '*'.
	Wildcard bool
	// ShareThreshold (share_threshold) makes all values matching a wildcard share one
	// counter, keyed by the pattern, instead of one counter per value.
	ShareThreshold bool
	// Priority is the descriptor's priority:, which the rules at and below it take (the
	// nearest one wins).
	Priority string
}

// Rule is a descriptor of the configuration that carries limits (or unlimited).
type Rule struct {
	// Domain is the rule's domain.
	Domain string
	// ID names the rule like envoyproxy/ratelimit's metric keys: the domain and each
	// level's key, or key_value when the level has a value, joined by '.', e.g.
	// "messaging.message_type_marketing.to_number". Use it as a metric label.
	ID string
	// File and Line locate the descriptor.
	File string
	Line int
	// Levels is the descriptor path from the domain down to this rule.
	Levels []Level
	// Limits all apply; a request passes the rule only if it passes every one. Empty when
	// Unlimited.
	Limits []Limit
	// Unlimited (rate_limit.unlimited) matches but never limits.
	Unlimited bool
	// ShadowMode decides and reports but never denies.
	ShadowMode bool
	// Priority (priority on the descriptor or the nearest one above it) names the share of
	// its pools the rule's requests may fill (Pool.Priorities): near a pool's capacity,
	// lower priorities are refused first. "" fills all.
	Priority string
	// QuotaMode, DetailedMetric and ValueToMetric are envoyproxy/ratelimit's flags of the
	// same names, carried for the enforcer and its metrics.
	QuotaMode      bool
	DetailedMetric bool
	ValueToMetric  bool

	replaces []string // an unlimited rule's replaces, which envoyproxy/ratelimit honours too
}

// AppendKey appends to dst the counter key of limit i of r for the request descriptor
// entries that matched r, and returns the extended slice. It does not allocate when dst
// has room.
//
// A counter key is the domain, then each entry as key=value, then '#' and the limit's
// WindowTag, joined by '|':
//
//	api|user=42|path=/articles#60s
//
// The value is the request's value, except at a wildcard level with share_threshold, where
// it is the configured pattern (all matching values share one counter). In the domain,
// keys and values the characters '%', '|', '=' and '#' are percent-encoded (%25, %7C, %3D,
// %23), so distinct descriptors never share a key, and so is every byte that is not part of
// valid UTF-8, as the Kafka records require. The aggregator and the Kafka hit records carry
// this string as is. A key longer than topics.MaxKeyLen is shortened (see boundKey), so
// that a long descriptor value still makes a key the hit records can carry.
func (r *Rule) AppendKey(dst []byte, entries []Entry, i int) []byte {
	start := len(dst)
	dst = appendEscaped(dst, r.Domain)
	for j, e := range entries {
		dst = append(dst, '|')
		dst = appendEscaped(dst, e.Key)
		dst = append(dst, '=')
		v := e.Value
		if j < len(r.Levels) && r.Levels[j].ShareThreshold {
			v = r.Levels[j].Value
		}
		dst = appendEscaped(dst, v)
	}
	dst = append(dst, '#')
	dst = append(dst, r.Limits[i].tag...)
	return boundKey(dst, start, 1+len(r.Limits[i].tag))
}

// longKeyMark stands in a shortened key for the part cut out of it. A key built by
// appendEscaped never holds it ('%' is always followed by two hex digits there), so a
// shortened key never equals one that was not.
const longKeyMark = "%~"

// longKeyDigest is how many bytes of the SHA-256 of the whole key a shortened key keeps
// (in hex, twice as many characters): 128 bits, so that two long keys share a counter
// only by a collision no client can search for.
const longKeyDigest = 16

// boundKey keeps the counter key dst[start:] within topics.MaxKeyLen bytes, and returns
// dst. A longer key keeps its first bytes (cut at a character boundary), then
// longKeyMark and the hex of the first longKeyDigest bytes of the SHA-256 of the whole
// key, then its last tail bytes (the '#' and window tag, and any mark after them): it
// stays readable by its domain and first entries, distinct for distinct keys, and the
// same at every site and in every process, which derive it from the same key. Without
// it a global key longer than the records allow could not be published, and the limit
// would be counted at each site alone. It does not allocate.
func boundKey(dst []byte, start, tail int) []byte {
	k := dst[start:]
	if len(k) <= topics.MaxKeyLen {
		return dst
	}
	sum := sha256.Sum256(k)
	keep := topics.MaxKeyLen - len(longKeyMark) - 2*longKeyDigest - tail
	for keep > 0 && !utf8.RuneStart(k[keep]) {
		keep--
	}
	at := keep + len(longKeyMark) + 2*longKeyDigest
	n := copy(k[at:], k[len(k)-tail:]) // moves left: copy handles the overlap
	copy(k[keep:], longKeyMark)
	hex.Encode(k[keep+len(longKeyMark):at], sum[:longKeyDigest])
	return dst[:start+at+n]
}

// Key returns AppendKey(nil, entries, i) as a string.
func (r *Rule) Key(entries []Entry, i int) string { return string(r.AppendKey(nil, entries, i)) }

func appendEscaped(dst []byte, s string) []byte {
	const hex = "0123456789ABCDEF"
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == '%' || c == '|' || c == '=' || c == '#':
			dst = append(dst, '%', hex[c>>4], hex[c&15])
			i++
		case c < utf8.RuneSelf:
			dst = append(dst, c)
			i++
		default:
			// Counter keys must be valid UTF-8 (they travel as JSON strings too): bytes
			// of an invalid sequence, which any request header can carry, are encoded.
			if r, size := utf8.DecodeRuneInString(s[i:]); r == utf8.RuneError && size == 1 {
				dst = append(dst, '%', hex[c>>4], hex[c&15])
				i++
			} else {
				dst = append(dst, s[i:i+size]...)
				i += size
			}
		}
	}
	return dst
}

// Config is a loaded set of domains. It is immutable and safe for simultaneous use.
type Config struct {
	domains map[string]*Domain
	files   []string
}

// Domain is the rules of one domain of a Config. A caller that matches several descriptors
// of one request finds the domain once (Config.Domain) and matches each descriptor in it.
type Domain struct {
	name   string
	file   string // the first file that configures it
	root   *node
	pools  map[string]*Pool
	compat Compat
}

// node is one level of a domain's descriptor tree.
type node struct {
	exact map[Entry]*node // key+value, and key-only as {key, ""}
	wild  []wildNode      // wildcard values, in configuration order
	rule  *Rule           // nil for a placeholder or a whitelisted descriptor
}

type wildNode struct {
	key   string
	parts []string // the pattern split at '*' (in a CompatEnvoy domain: its prefix, and "")
	n     *node
}

// Domains returns the names of the configured domains.
func (c *Config) Domains() []string {
	names := make([]string, 0, len(c.domains))
	for n := range c.domains {
		names = append(names, n)
	}
	return names
}

// Rules returns every rule of the Config (those with limits and the unlimited ones),
// ordered by file and line. Placeholder levels without limits are not rules.
func (c *Config) Rules() []*Rule {
	var out []*Rule
	var walk func(n *node)
	walk = func(n *node) {
		if n == nil {
			return
		}
		if n.rule != nil {
			out = append(out, n.rule)
		}
		for _, child := range n.exact {
			walk(child)
		}
		for _, w := range n.wild {
			walk(w.n)
		}
	}
	for _, d := range c.domains {
		walk(d.root)
	}
	slices.SortFunc(out, func(a, b *Rule) int {
		if c := strings.Compare(a.File, b.File); c != 0 {
			return c
		}
		return a.Line - b.Line
	})
	return out
}

// Files returns the files the Config was loaded from.
func (c *Config) Files() []string { return append([]string(nil), c.files...) }

// Domain returns the rules of the domain named name, or nil when c configures no such
// domain (or c is nil). It does not allocate.
func (c *Config) Domain(name string) *Domain {
	if c == nil {
		return nil
	}
	return c.domains[name]
}

// Match returns the rule for one request descriptor of domain, or nil when no rule
// applies: Domain(domainName).Match(entries).
func (c *Config) Match(domainName string, entries []Entry) *Rule {
	return c.Domain(domainName).Match(entries)
}

// Match returns the rule for one request descriptor, or nil when no rule applies (always
// on a nil Domain), the way envoyproxy/ratelimit does: walk the tree one entry per level;
// at each level prefer the exact key+value, then the first wildcard value that matches,
// then the key alone (any value). The walk does not backtrack. A rule applies only when it
// is reached at the descriptor's last entry, so a descriptor with more entries than the
// configuration's nesting matches nothing. Match does not allocate.
func (d *Domain) Match(entries []Entry) *Rule {
	if d == nil || len(entries) == 0 {
		return nil
	}
	n := d.root
	for i, e := range entries {
		// An empty value would find the key-only descriptor among the exact ones, before
		// the wildcards; a "*" matches it first, as envoyproxy/ratelimit has it.
		var next *node
		if e.Value != "" {
			next = n.exact[e]
		}
		if next == nil {
			for j := range n.wild {
				if w := &n.wild[j]; w.key == e.Key && wildcardMatch(w.parts, e.Value) {
					next = w.n
					break
				}
			}
		}
		if next == nil {
			next = n.exact[Entry{Key: e.Key}]
		}
		if next == nil {
			return nil
		}
		if i == len(entries)-1 {
			return next.rule
		}
		n = next
	}
	return nil
}

// wildcardMatch reports whether v matches the pattern split at '*' into parts; each '*'
// matches any run of characters, possibly empty.
func wildcardMatch(parts []string, v string) bool {
	if len(parts) == 1 {
		return parts[0] == v
	}
	first, last := parts[0], parts[len(parts)-1]
	if len(v) < len(first)+len(last) || !strings.HasPrefix(v, first) || !strings.HasSuffix(v, last) {
		return false
	}
	rest := v[len(first) : len(v)-len(last)]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(rest, p)
		if i < 0 {
			return false
		}
		rest = rest[i+len(p):]
	}
	return true
}

// Active applies envoyproxy/ratelimit's replaces to the rules matched by one request (one
// per descriptor, nil where none matched): a limit whose Name is listed in the Replaces of
// any matched limit is not in force. It returns dst (grown as needed) with one bit set
// per limit in force: bit j of dst[i] is limit j of rules[i]. Rules have at most 64
// limits. It does not allocate when dst has room.
func Active(rules []*Rule, dst []uint64) []uint64 {
	dst = dst[:0]
	for _, r := range rules {
		var mask uint64
		if r != nil {
			for j := range r.Limits {
				if !replaced(rules, r.Limits[j].Name) {
					mask |= 1 << uint(j)
				}
			}
		}
		dst = append(dst, mask)
	}
	return dst
}

func replaced(rules []*Rule, name string) bool {
	if name == "" {
		return false
	}
	for _, r := range rules {
		if r == nil {
			continue
		}
		for _, n := range r.replaces {
			if n == name {
				return true
			}
		}
		for j := range r.Limits {
			for _, n := range r.Limits[j].Replaces {
				if n == name {
					return true
				}
			}
		}
	}
	return false
}
