package rules

import (
	"fmt"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"
)

// Pool is a global limit that the requests of many clients count toward together: the
// capacity of a whole API, shared across every site. A limit joins it with pool: NAME, and
// then each request that limit admits also takes one from the pool, and is refused when
// the pool is full. A pool is what elastic limits and priorities read: how busy the system
// is, across all data centers, from the counts the aggregators already publish (the pool is
// one more counter key, hit by every request of its members).
type Pool struct {
	// Name names the pool within its domain.
	Name string
	// Limit is the pool's capacity per window; always global scope, sliding window.
	Limit Limit
	// Priorities maps a priority name to the percentage of the pool requests of that
	// priority may fill (priority on a descriptor). A request without a priority, or with
	// one the pool does not list, may fill all of it.
	Priorities map[string]int
	// Key is the pool's counter key: "<domain>|pool=<name>#<window>|pool". The mark after
	// the window tag keeps it apart from the key of a rule whose descriptor is pool=<name>
	// (a rule's key ends with its tag, which never holds '|').
	Key string
	// File and Line locate the pool's definition.
	File string
	Line int
}

// Fill returns the percentage of p that requests of priority may fill.
func (p *Pool) Fill(priority string) int {
	if pct, ok := p.Priorities[priority]; ok {
		return pct
	}
	return 100
}

// Elastic lets a limit rise above its base while its pool has room: a client may use up to
// Max requests per window while the pool is filled below Until percent of its capacity, and
// its limit comes back linearly to Requests as the pool fills from Until to 100 percent, so
// that a busy system pulls clients back gradually rather than all at once.
type Elastic struct {
	Max   int64
	Until int
}

// Requests returns the limit's effective requests per window when its pool is filled to
// fraction used of its capacity (0 empty, 1 full).
func (e *Elastic) Requests(base int64, used float64) int64 {
	if e == nil || e.Max <= base {
		return base
	}
	until := float64(e.Until) / 100
	g := 1.0
	if used > until {
		g = max(0, (1-used)/(1-until))
	}
	return base + int64(float64(e.Max-base)*g)
}

var poolFields = []string{"name", "rate_limit", "priorities"}

// pools parses a domain's pools: list.
func (p *parser) pools(seq *yaml.Node, d *Domain) {
	if seq.Kind != yaml.SequenceNode {
		p.errorf(seq, "pools", "want a list, got %s", kindName(seq))
		return
	}
	for i, item := range seq.Content {
		prefix := fmt.Sprintf("pools[%d].", i)
		pl := &Pool{File: p.file, Line: item.Line}
		var rl, nameNode *yaml.Node
		p.fields(item, prefix, poolFields, func(key string, k, v *yaml.Node) {
			switch key {
			case "name":
				nameNode = v
				pl.Name, _ = p.str(v, prefix+key)
			case "rate_limit":
				rl = v
			case "priorities":
				pl.Priorities = p.priorities(v, prefix+key)
			}
		})
		if item.Kind != yaml.MappingNode {
			continue
		}
		switch {
		case nameNode == nil || pl.Name == "":
			p.errorf(item, prefix+"name", "missing or empty")
			continue
		case d.pools[pl.Name] != nil:
			p.errorf(nameNode, prefix+"name", "duplicate pool %q", pl.Name)
			continue
		case rl == nil:
			p.errorf(item, prefix+"rate_limit", "missing (the pool's capacity)")
			continue
		}
		l, unlimited, ok := p.limit(rl, prefix+"rate_limit.", poolLimit)
		if !ok || unlimited {
			continue
		}
		if l.Scope != Global || l.Elastic != nil || l.pool != "" {
			p.errorf(rl, prefix+"rate_limit", "a pool is a global limit without pool or elastic")
			continue
		}
		pl.Limit = l
		if d.pools == nil {
			d.pools = map[string]*Pool{}
		}
		d.pools[pl.Name] = pl
	}
}

func (p *parser) priorities(m *yaml.Node, field string) map[string]int {
	if m.Kind != yaml.MappingNode {
		p.errorf(m, field, "want a map of priority name to percent, got %s", kindName(m))
		return nil
	}
	out := map[string]int{}
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := m.Content[i], m.Content[i+1]
		n, ok := p.integer(v, field+"."+k.Value)
		if !ok {
			continue
		}
		if n < 0 || n > 100 {
			p.errorf(v, field+"."+k.Value, "%d outside 0…100", n)
			continue
		}
		out[k.Value] = int(n)
	}
	return out
}

var elasticFields = []string{"max", "until"}

// elastic parses a limit's elastic: block.
func (p *parser) elastic(m *yaml.Node, field string) *Elastic {
	e := &Elastic{Until: 50}
	var maxNode *yaml.Node
	p.fields(m, field+".", elasticFields, func(key string, k, v *yaml.Node) {
		n, ok := p.integer(v, field+"."+key)
		if !ok {
			return
		}
		switch key {
		case "max":
			maxNode, e.Max = v, n
		case "until":
			if n < 0 || n >= 100 {
				p.errorf(v, field+".until", "%d outside 0…99 (percent of the pool's capacity)", n)
			}
			e.Until = int(n)
		}
	})
	if m.Kind == yaml.MappingNode && maxNode == nil {
		p.errorf(m, field+".max", "missing (the most requests per window while the pool has room)")
	}
	return e
}

// poolMark ends a pool's counter key, as overrideMark ends an override's.
const poolMark = "|pool"

// resolvePools links each limit's pool: name to the domain's Pool, with the error at the
// limit when there is no such pool or the limit is elastic without one. It goes through
// the rules in the order of the file, so that its errors come in that order.
func (p *parser) resolvePools(d *Domain) {
	for _, pl := range d.pools {
		pl.Key = string(appendEscaped(nil, d.name)) + "|pool=" + string(appendEscaped(nil, pl.Name)) + "#" + pl.Limit.tag + poolMark
	}
	for _, r := range p.rules {
		for i := range r.Limits {
			l := &r.Limits[i]
			if l.pool != "" {
				if l.Pool = d.pools[l.pool]; l.Pool == nil {
					p.errs = append(p.errs, &Error{File: r.File, Line: l.Line, Field: "pool", Reason: fmt.Sprintf("no pool %q in domain %q (define it under pools:)", l.pool, d.name)})
				}
			}
			if l.Elastic != nil && l.Pool == nil && l.pool == "" {
				p.errs = append(p.errs, &Error{File: r.File, Line: l.Line, Field: "elastic", Reason: "needs a pool to read how busy the system is (pool: NAME)"})
			}
			if l.Elastic != nil && l.Elastic.Max <= l.Requests {
				p.errs = append(p.errs, &Error{File: r.File, Line: l.Line, Field: "elastic.max", Reason: fmt.Sprintf("%d is not above requests_per_unit %d", l.Elastic.Max, l.Requests)})
			}
		}
		if r.Priority != "" && !slices.ContainsFunc(r.Limits, func(l Limit) bool { return l.Pool != nil && l.Pool.Priorities[r.Priority] != 0 }) {
			known := false
			for _, pl := range d.pools {
				_, ok := pl.Priorities[r.Priority]
				known = known || ok
			}
			if !known {
				p.errs = append(p.errs, &Error{File: r.File, Line: r.Line, Field: "priority", Reason: fmt.Sprintf("%q is not listed by any pool's priorities in domain %q", r.Priority, d.name)})
			}
		}
	}
}

// Pools returns the pools of domainName, sorted by name.
func (c *Config) Pools(domainName string) []*Pool {
	d := c.domains[domainName]
	if d == nil {
		return nil
	}
	out := make([]*Pool, 0, len(d.pools))
	for _, pl := range d.pools {
		out = append(out, pl)
	}
	slices.SortFunc(out, func(a, b *Pool) int { return strings.Compare(a.Name, b.Name) })
	return out
}
