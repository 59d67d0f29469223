package rules

import (
	"fmt"
	"math"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/streamlimit/streamlimit/enforcer/algo"
)

// A rate_limit block is parsed in two passes. First each field, on its own, through its
// row of limitFields: its type, its range, its value on the Limit. Then, if every field
// parsed, the checks across fields, limitChecks, one after the other. A new field is a row
// of limitFields, and a step of limitChecks when it constrains or changes other fields.

// limitBlock is one rate_limit block being parsed: the Limit it builds, and what the
// checks across fields need besides.
type limitBlock struct {
	l      Limit
	m      *yaml.Node // the block, for errors about a missing field
	prefix string     // the block's field path with a trailing '.', e.g. "descriptors[0].rate_limit."
	nerr   int        // the parser's error count before the block

	at         map[string]*yaml.Node // each field's value node, by field name, for errors
	unitWindow time.Duration         // the length of the unit that unit names
	unlimited  bool                  // unlimited: true
}

// set reports whether the block has the field key.
func (b *limitBlock) set(key string) bool { return b.at[key] != nil }

// clean reports whether p has found no error in the block so far.
func (p *parser) clean(b *limitBlock) bool { return len(p.errs) == b.nerr }

// limitFields are the fields of a rate_limit block, in the order that an unknown field's
// error lists them.
var limitFields = []field[*limitBlock]{
	{"unit", (*parser).limitUnit},
	{"requests_per_unit", (*parser).limitRequests},
	{"name", func(p *parser, b *limitBlock, v *yaml.Node, f string) { b.l.Name, _ = p.str(v, f) }},
	{"replaces", func(p *parser, b *limitBlock, v *yaml.Node, f string) { p.replaces(v, f, &b.l) }},
	{"unlimited", func(p *parser, b *limitBlock, v *yaml.Node, f string) { b.unlimited = p.boolean(v, f) }},
	{"window", (*parser).limitWindow},
	{"algorithm", (*parser).limitAlgorithm},
	{"scope", (*parser).limitScope},
	{"soft_percent", (*parser).limitSoftPercent},
	{"burst", (*parser).limitBurst},
	{"hard", func(p *parser, b *limitBlock, v *yaml.Node, f string) { b.l.Hard = p.boolean(v, f) }},
	{"pool", func(p *parser, b *limitBlock, v *yaml.Node, f string) { b.l.pool, _ = p.str(v, f) }},
	{"elastic", func(p *parser, b *limitBlock, v *yaml.Node, f string) { b.l.Elastic = p.elastic(v, f) }},
	{"align", (*parser).limitAlign},
}

// limitFieldNames are the names of limitFields, in their order.
var limitFieldNames = fieldNames(limitFields)

// limitChecks are the checks across the fields of a limit (not an unlimited one), in the
// order in which they run and so report. Those that depend on the fields being coherent
// (the calendar, the range of a global count, algo's check) skip a block that an earlier
// check has already faulted.
var limitChecks = []func(p *parser, b *limitBlock){
	(*parser).limitPeriod,
	(*parser).limitCalendar,
	(*parser).limitGlobalAlgorithm,
	(*parser).limitHard,
	(*parser).limitGlobalRange,
	(*parser).limitBurstApplies,
	(*parser).limitValid,
}

// limitKind says where a rate_limit block stands.
type limitKind uint8

const (
	ruleLimit limitKind = iota // a descriptor's rate_limit, which may be unlimited
	listLimit                  // an item of a descriptor's rate_limits
	poolLimit                  // a pool's capacity
)

// limit parses one rate_limit block of kind. unlimited is reported when the block says so
// (only a ruleLimit may).
func (p *parser) limit(m *yaml.Node, prefix string, kind limitKind) (l Limit, unlimited, ok bool) {
	b := &limitBlock{m: m, prefix: prefix, nerr: len(p.errs)}
	b.l.Line = m.Line
	b.l.Algorithm, b.l.Scope = DefaultAlgorithm, DefaultScope
	b.at = envoyTable(p, m, prefix, limitFields, limitFieldNames, b)
	if m.Kind != yaml.MappingNode || !p.clean(b) {
		return b.l, false, false
	}
	p.compatDefaults(b, kind)
	p.limitSelfReplace(b)
	if b.unlimited {
		p.limitUnlimited(b, kind == ruleLimit)
		return b.l, true, p.clean(b)
	}
	for _, check := range limitChecks {
		check(p, b)
	}
	b.l.tag = windowTag(b.l.CountWindow())
	return b.l, false, p.clean(b)
}

// units are envoyproxy/ratelimit's units, with its lengths for month and year.
var units = []struct {
	name string
	d    time.Duration
}{
	{"second", time.Second}, {"minute", time.Minute}, {"hour", time.Hour}, {"day", 24 * time.Hour},
	{"week", 7 * 24 * time.Hour}, {"month", 30 * 24 * time.Hour}, {"year", 365 * 24 * time.Hour},
}

func unitNames() string {
	names := make([]string, len(units))
	for i, u := range units {
		names[i] = u.name
	}
	return strings.Join(names, ", ")
}

func (p *parser) limitUnit(b *limitBlock, v *yaml.Node, f string) {
	s, ok := p.str(v, f)
	if !ok {
		return
	}
	b.l.Unit = s
	for _, u := range units {
		if strings.EqualFold(u.name, s) { // envoyproxy/ratelimit upper-cases the unit
			b.unitWindow = u.d
			return
		}
	}
	p.errorf(v, f, "unknown unit %q (want %s)", s, unitNames())
}

func (p *parser) limitRequests(b *limitBlock, v *yaml.Node, f string) {
	if n, ok := p.integer(v, f); ok {
		if n < 0 {
			p.errorf(v, f, "%d < 0", n)
		}
		b.l.Requests = n
	}
}

func (p *parser) limitWindow(b *limitBlock, v *yaml.Node, f string) {
	if s, ok := p.str(v, f); ok {
		d, err := ParseWindow(s)
		if err != nil {
			p.errorf(v, f, "%v", err)
		} else {
			b.l.Window = d
		}
	}
}

func (p *parser) limitAlgorithm(b *limitBlock, v *yaml.Node, f string) {
	if s, ok := p.str(v, f); ok {
		a, err := algo.ParseAlgorithm(s)
		if err != nil {
			p.errorf(v, f, "unknown algorithm %q (want %s)", s, strings.Join(algo.Names(), ", "))
		}
		b.l.Algorithm = a
	}
}

func (p *parser) limitScope(b *limitBlock, v *yaml.Node, f string) {
	if s, ok := p.str(v, f); ok {
		sc, err := ParseScope(s)
		if err != nil {
			p.errorf(v, f, "unknown scope %q (want local, site, global)", s)
		}
		b.l.Scope = sc
	}
}

func (p *parser) limitSoftPercent(b *limitBlock, v *yaml.Node, f string) {
	if n, ok := p.integer(v, f); ok {
		if n < 0 || n > 1000 {
			p.errorf(v, f, "%d outside 0…1000", n)
		}
		b.l.SoftPercent = int(n)
	}
}

func (p *parser) limitBurst(b *limitBlock, v *yaml.Node, f string) {
	if n, ok := p.integer(v, f); ok {
		if n <= 0 {
			p.errorf(v, f, "%d ≤ 0 (omit it for a capacity equal to requests_per_unit)", n)
		}
		b.l.Burst = n
	}
}

// limitAlign takes align: calendar; limitCalendar makes the limit a calendar window.
func (p *parser) limitAlign(b *limitBlock, v *yaml.Node, f string) {
	if s, ok := p.str(v, f); ok {
		if s != "calendar" {
			p.errorf(v, f, "unknown alignment %q (want calendar)", s)
		}
		b.l.Calendar = true
	}
}

// limitSelfReplace rejects a limit that names itself in replaces.
func (p *parser) limitSelfReplace(b *limitBlock) {
	for _, r := range b.l.Replaces {
		if r == b.l.Name && r != "" {
			p.errorf(b.m, b.prefix+"replaces", "a limit cannot replace itself (%q)", r)
		}
	}
}

// limitUnlimited checks an unlimited block: allowed here, and without a period.
func (p *parser) limitUnlimited(b *limitBlock, allowUnlimited bool) {
	switch {
	case !allowUnlimited:
		p.errorf(b.at["unlimited"], b.prefix+"unlimited", "not allowed in rate_limits (use rate_limit: {unlimited: true})")
	case b.set("unit"):
		p.errorf(b.at["unit"], b.prefix+"unit", "should not be set when unlimited")
	case b.set("window"):
		p.errorf(b.at["window"], b.prefix+"window", "should not be set when unlimited")
	}
}

// limitPeriod requires requests_per_unit and a period, unit or window (both when they
// agree), and sets Window from the unit.
func (p *parser) limitPeriod(b *limitBlock) {
	l := &b.l
	switch {
	case !b.set("requests_per_unit"):
		p.errorf(b.m, b.prefix+"requests_per_unit", "missing (write 0 to reject every request)")
	case !b.set("unit") && !b.set("window"):
		p.errorf(b.m, b.prefix+"unit", "missing (set unit or window)")
	case b.set("unit") && b.set("window") && l.Window != b.unitWindow:
		p.errorf(b.at["window"], b.prefix+"window", "%v contradicts unit %s (%v); set one of them", l.Window, l.Unit, b.unitWindow)
	case b.set("unit"):
		l.Window = b.unitWindow
	}
	if l.Window <= 0 && b.set("window") && p.clean(b) {
		p.errorf(b.at["window"], b.prefix+"window", "must be positive")
	}
}

// limitCalendar makes a limit with align: calendar the fixed window on its unit's
// calendar, where it counts by fixed windows (local or site scope, fixed_window).
func (p *parser) limitCalendar(b *limitBlock) {
	l := &b.l
	if !b.set("align") || !l.Calendar || !p.clean(b) {
		return
	}
	switch {
	case l.Scope == Global:
		at := b.at["scope"]
		if at == nil {
			at = b.at["align"]
		}
		p.errorf(at, b.prefix+"align", "calendar windows are not available in global scope, whose counts slide over sub-buckets across sites (set scope: local or site)")
	case b.set("algorithm") && l.Algorithm != algo.FixedWindow:
		p.errorf(b.at["algorithm"], b.prefix+"algorithm", "%s does not combine with align: calendar, which counts by fixed windows (omit algorithm or write fixed_window)", l.Algorithm)
	default:
		cal := algo.Epoch
		switch {
		case strings.EqualFold(l.Unit, "month"):
			cal = algo.Month
		case strings.EqualFold(l.Unit, "year"):
			cal = algo.Year
		}
		l.Algorithm = algo.FixedWindowOn(cal)
	}
}

// limitGlobalAlgorithm allows in global scope only the algorithms that a global count
// (a sliding window over sub-buckets) can carry.
func (p *parser) limitGlobalAlgorithm(b *limitBlock) {
	l := &b.l
	if l.Scope != Global || l.Algorithm == algo.SlidingWindow || l.Algorithm == algo.TokenBucket || l.Algorithm == algo.GCRA {
		return
	}
	at := b.at["algorithm"]
	if at == nil {
		at = b.at["scope"]
	}
	if at == nil {
		at = b.m
	}
	p.errorf(at, b.prefix+"algorithm", "%s is not available in global scope (global limits use sliding_window, token_bucket or gcra; set scope: local or site)", l.Algorithm)
}

// limitHard allows hard: true on global limits only.
func (p *parser) limitHard(b *limitBlock) {
	if b.set("hard") && b.l.Hard && b.l.Scope != Global {
		p.errorf(b.at["hard"], b.prefix+"hard", "applies to global limits (local and site limits count exactly with sliding_log, or by whole windows with fixed_window)")
	}
}

// limitGlobalRange keeps a global limit within what a global count holds.
func (p *parser) limitGlobalRange(b *limitBlock) {
	l := &b.l
	if l.Scope != Global || !p.clean(b) {
		return
	}
	// Global counts are kept in uint32 buckets that saturate at 2³²−1 (window.Ring): a
	// global limit above that could never be reached, so it would never deny.
	const most = math.MaxUint32
	switch {
	case l.Requests > most:
		p.errorf(b.at["requests_per_unit"], b.prefix+"requests_per_unit", "%d is above %d, the most a global count holds (use scope: local or site)", l.Requests, int64(most))
	case float64(l.Requests)*float64(100+l.SoftPercent)/100 > most:
		p.errorf(b.at["requests_per_unit"], b.prefix+"requests_per_unit", "%d raised by soft_percent %d is above %d, the most a global count holds", l.Requests, l.SoftPercent, int64(most))
	case l.Burst > most:
		p.errorf(b.at["burst"], b.prefix+"burst", "%d is above %d, the most a global count holds", l.Burst, int64(most))
	}
}

// limitBurstApplies allows burst only on the algorithms that have a bucket.
func (p *parser) limitBurstApplies(b *limitBlock) {
	a := b.l.Algorithm
	if b.set("burst") && a != algo.TokenBucket && a != algo.LeakyBucket && a != algo.GCRA {
		p.errorf(b.at["burst"], b.prefix+"burst", "applies only to token_bucket, leaky_bucket and gcra, not %s", a)
	}
}

// limitValid runs package algo's own checks of the limit, once every other has passed.
func (p *parser) limitValid(b *limitBlock) {
	if !p.clean(b) {
		return
	}
	if err := b.l.Algo().Validate(); err != nil {
		p.errorf(b.m, strings.TrimSuffix(b.prefix, "."), "%v", err)
	}
}

func (p *parser) replaces(v *yaml.Node, f string, l *Limit) {
	if v.Kind != yaml.SequenceNode {
		p.errorf(v, f, "want a list of {name: …}, got %s", kindName(v))
		return
	}
	for i, item := range v.Content {
		fi := fmt.Sprintf("%s[%d].", f, i)
		var name string
		p.envoyFields(item, fi, []string{"name"}, func(_ string, _, nv *yaml.Node) {
			name, _ = p.str(nv, fi+"name")
		})
		if item.Kind == yaml.MappingNode && name == "" {
			p.errorf(item, fi+"name", "missing or empty")
			continue
		}
		l.Replaces = append(l.Replaces, name)
	}
}

const maxLimits = 64

// limitList parses rate_limits: a list of limits with distinct windows, into r.
func (p *parser) limitList(seq *yaml.Node, field string, r *Rule) {
	if seq.Kind != yaml.SequenceNode || len(seq.Content) == 0 {
		p.errorf(seq, field, "want a non-empty list of limits, got %s", kindName(seq))
		return
	}
	if len(seq.Content) > maxLimits {
		p.errorf(seq, field, "%d limits, at most %d", len(seq.Content), maxLimits)
		return
	}
	windows := make(map[time.Duration]int)
	for i, item := range seq.Content {
		f := fmt.Sprintf("%s[%d].", field, i)
		l, _, ok := p.limit(item, f, listLimit)
		if !ok {
			continue
		}
		if j, dup := windows[l.Window]; dup {
			p.errorf(item, f+"window", "same window %v as %s[%d]: the two limits would share one counter", l.Window, field, j)
			continue
		}
		windows[l.Window] = i
		r.Limits = append(r.Limits, l)
	}
}

// ParseWindow parses a window: a Go duration ("90s", "3h", "1h30m") that may also use the
// units d (24h) and w (7 × 24h), e.g. "7d", "2w", "1d12h".
func ParseWindow(s string) (time.Duration, error) {
	orig := s
	if s == "" {
		return 0, fmt.Errorf("empty window")
	}
	var total time.Duration
	for s != "" {
		i := 0
		for i < len(s) && (s[i] == '.' || (s[i] >= '0' && s[i] <= '9')) {
			i++
		}
		j := i
		for j < len(s) && !(s[j] == '.' || (s[j] >= '0' && s[j] <= '9')) {
			j++
		}
		num, unit := s[:i], s[i:j]
		s = s[j:]
		var d time.Duration
		var err error
		switch unit {
		case "d", "w":
			d, err = time.ParseDuration(num + "h")
			mult := time.Duration(24)
			if unit == "w" {
				mult = 7 * 24
			}
			if err == nil && d > (1<<62)/mult {
				err = fmt.Errorf("too long")
			}
			d *= mult
		default:
			d, err = time.ParseDuration(num + unit)
		}
		if err != nil || num == "" {
			return 0, fmt.Errorf("invalid window %q (want a duration such as 90s, 3h, 7d)", orig)
		}
		if total += d; total < 0 || total > 1<<62 {
			return 0, fmt.Errorf("window %q too long", orig)
		}
	}
	if total <= 0 {
		return 0, fmt.Errorf("window %q must be positive", orig)
	}
	return total, nil
}
