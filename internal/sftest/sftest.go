// Package sftest parses HTTP Structured Field Lists (RFC 9651) strictly, so that tests of
// the RateLimit fields can check their syntax and read them back field by field. It
// supports Lists of Items with parameters (no inner lists, byte sequences, dates or
// display strings, which the RateLimit fields do not use).
package sftest

import (
	"fmt"
	"strconv"
	"strings"
)

// Item is a parsed Structured Field Item (RFC 9651 §3.3) with its parameters, in
// order. Bare items are string, int64, float64 (decimal), bool or Token.
type Item struct {
	Value  any
	Params []Param
}

// Param is one parameter of an Item; a parameter without a value is true.
type Param struct {
	Key   string
	Value any
}

// Token is a bare Token item (RFC 9651 §3.3.4), distinct from a String.
type Token string

// Param returns the value of parameter k.
func (it Item) Param(k string) (any, bool) {
	for _, p := range it.Params {
		if p.Key == k {
			return p.Value, true
		}
	}
	return nil, false
}

// ParseList parses a List of Items (inner lists are rejected: the RateLimit fields
// have none) strictly as RFC 9651 §4.2 says.
func ParseList(s string) ([]Item, error) {
	p := &parser{s: s}
	p.skipSP()
	var out []Item
	for !p.eof() {
		it, err := p.item()
		if err != nil {
			return nil, err
		}
		out = append(out, it)
		p.skipOWS()
		if p.eof() {
			return out, nil
		}
		if p.s[p.i] != ',' {
			return nil, p.errf("expected ','")
		}
		p.i++
		p.skipOWS()
		if p.eof() {
			return nil, p.errf("trailing comma")
		}
	}
	if p.i != len(p.s) {
		return nil, p.errf("trailing data")
	}
	return out, nil
}

type parser struct {
	s string
	i int
}

func (p *parser) eof() bool { return p.i >= len(p.s) }
func (p *parser) errf(f string, a ...any) error {
	return fmt.Errorf("sf: at %d of %q: %s", p.i, p.s, fmt.Sprintf(f, a...))
}
func (p *parser) skipSP() {
	for !p.eof() && p.s[p.i] == ' ' {
		p.i++
	}
}
func (p *parser) skipOWS() {
	for !p.eof() && (p.s[p.i] == ' ' || p.s[p.i] == '\t') {
		p.i++
	}
}

func (p *parser) item() (Item, error) {
	v, err := p.bare()
	if err != nil {
		return Item{}, err
	}
	it := Item{Value: v}
	for !p.eof() && p.s[p.i] == ';' {
		p.i++
		p.skipSP()
		k, err := p.key()
		if err != nil {
			return it, err
		}
		var pv any = true
		if !p.eof() && p.s[p.i] == '=' {
			p.i++
			if pv, err = p.bare(); err != nil {
				return it, err
			}
		}
		for _, q := range it.Params {
			if q.Key == k {
				return it, p.errf("duplicate parameter %q", k)
			}
		}
		it.Params = append(it.Params, Param{k, pv})
	}
	return it, nil
}

func (p *parser) key() (string, error) {
	st := p.i
	if p.eof() || !(p.s[p.i] >= 'a' && p.s[p.i] <= 'z' || p.s[p.i] == '*') {
		return "", p.errf("bad key")
	}
	for !p.eof() {
		c := p.s[p.i]
		if c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || strings.IndexByte("_-.*", c) >= 0 {
			p.i++
			continue
		}
		break
	}
	return p.s[st:p.i], nil
}

func (p *parser) bare() (any, error) {
	if p.eof() {
		return nil, p.errf("missing item")
	}
	c := p.s[p.i]
	switch {
	case c == '"':
		p.i++
		var b strings.Builder
		for !p.eof() {
			c := p.s[p.i]
			p.i++
			switch {
			case c == '\\':
				if p.eof() || (p.s[p.i] != '"' && p.s[p.i] != '\\') {
					return nil, p.errf("bad escape")
				}
				b.WriteByte(p.s[p.i])
				p.i++
			case c == '"':
				return b.String(), nil
			case c < 0x20 || c > 0x7e:
				return nil, p.errf("bad string byte %#x", c)
			default:
				b.WriteByte(c)
			}
		}
		return nil, p.errf("unterminated string")
	case c == '-' || c >= '0' && c <= '9':
		st := p.i
		p.i++
		for !p.eof() && (p.s[p.i] >= '0' && p.s[p.i] <= '9' || p.s[p.i] == '.') {
			p.i++
		}
		num := p.s[st:p.i]
		if strings.Contains(num, ".") {
			f, err := strconv.ParseFloat(num, 64)
			if err != nil {
				return nil, p.errf("bad decimal")
			}
			return f, nil
		}
		if len(strings.TrimPrefix(num, "-")) > 15 {
			return nil, p.errf("integer too long")
		}
		n, err := strconv.ParseInt(num, 10, 64)
		if err != nil {
			return nil, p.errf("bad integer")
		}
		return n, nil
	case c == '?':
		if p.i+1 < len(p.s) && (p.s[p.i+1] == '0' || p.s[p.i+1] == '1') {
			p.i += 2
			return p.s[p.i-1] == '1', nil
		}
		return nil, p.errf("bad boolean")
	case c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '*':
		st := p.i
		for !p.eof() && (p.s[p.i] > 0x20 && p.s[p.i] < 0x7f && strings.IndexByte("\"(),;<=>?@[\\]{}", p.s[p.i]) < 0 || p.s[p.i] == ':' || p.s[p.i] == '/') {
			p.i++
		}
		return Token(p.s[st:p.i]), nil
	}
	return nil, p.errf("unexpected %q", c)
}
