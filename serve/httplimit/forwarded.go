package httplimit

import (
	"net/netip"
	"strings"
)

// The Forwarded header (RFC 7239) is a list of elements, each a list of name=value pairs
// separated by ';', where a value is a token or a quoted string:
//
//	Forwarded: for=192.0.2.60;proto=http;by=203.0.113.43, for="[2001:db8::1]:4711"
//
// A client can write anything before the element its proxy appends, and a proxy that
// appends to the line the client sent ("…, for=<peer>") leaves the client's text in front
// of its own. Read left to right, an unterminated quote in the client's part swallows the
// proxy's element (`for=1.2.3.4;x="` makes the rest of the line one quoted string), and the
// client names itself. So the line is read from the right, the way the walk goes: each
// element is parsed backwards, strictly, and the first that does not parse stops the walk.
// The elements a trusted proxy wrote are well formed and end the line, so they are read
// as written whatever the client put in front of them; the client's own text is reached,
// if at all, only once the walk is past every trusted proxy, and then it names nothing
// unless it parses.

// walkForwarded walks the Forwarded header lines from the right: past trusted proxies,
// to the first untrusted "for" address (the client). Lines are read last to first, each
// on its own, so that a quote left open in one line never reaches into the next. An
// element that does not parse, or that has no "for", stops the walk at cur, the last
// address believed; empty list elements (", ,") are skipped, as RFC 9110 lists allow.
func (c *compiled) walkForwarded(cur netip.Addr, lines []string) netip.Addr {
	for i := len(lines) - 1; i >= 0; i-- {
		line := lines[i]
		for more := true; more; {
			var (
				forv  string
				pairs int
				ok    bool
			)
			forv, pairs, line, more, ok = lastForwardedElement(line)
			if !ok {
				return cur
			}
			if pairs == 0 {
				continue
			}
			var end bool
			if cur, end = c.step(cur, forv); end {
				return cur
			}
		}
	}
	return cur
}

// lastForwardedElement parses the last element of s, a Forwarded line or the part of it
// left of an element already read, and returns its "for" value (unquoted, "" when it has
// none), its number of pairs, the part of s before the element's separating comma with
// more set when there is such a comma, and whether the element is well formed: pairs of a
// token, '=' and a token or quoted string, separated by ';', each name at most once, with
// optional white space around the separators.
func lastForwardedElement(s string) (forv string, pairs int, rest string, more, ok bool) {
	end := skipOWSBack(s, len(s))
	var names [8]string // enough for RFC 7239's four parameters and a few extensions
	n := 0
	for {
		// A pair, read backwards: the value, '=', the name. An empty pair (";;") is allowed.
		if end > 0 && s[end-1] != ';' && s[end-1] != ',' {
			var val string
			var vstart int
			if s[end-1] == '"' {
				q, found := quotedBack(s, end)
				if !found {
					return "", 0, "", false, false
				}
				vstart = q
				if val, found = unquote(s[q:end]); !found {
					return "", 0, "", false, false
				}
			} else {
				vstart = tokenBack(s, end)
				if vstart == end {
					return "", 0, "", false, false
				}
				val = s[vstart:end]
			}
			if vstart == 0 || s[vstart-1] != '=' {
				return "", 0, "", false, false
			}
			nend := vstart - 1
			nstart := tokenBack(s, nend)
			if nstart == nend {
				return "", 0, "", false, false
			}
			name := s[nstart:nend]
			for _, seen := range names[:n] {
				if strings.EqualFold(seen, name) {
					return "", 0, "", false, false // a parameter given twice in one element
				}
			}
			if n == len(names) {
				return "", 0, "", false, false // more parameters than any proxy writes
			}
			names[n] = name
			n++
			if strings.EqualFold(name, "for") {
				forv = val
			}
			end = skipOWSBack(s, nstart)
		}
		switch {
		case end == 0:
			return forv, n, "", false, true
		case s[end-1] == ';':
			end = skipOWSBack(s, end-1)
		case s[end-1] == ',':
			return forv, n, s[:end-1], true, true
		default:
			return "", 0, "", false, false
		}
	}
}

// skipOWSBack returns the index before the white space (SP, HTAB) that ends s[:end].
func skipOWSBack(s string, end int) int {
	for end > 0 && (s[end-1] == ' ' || s[end-1] == '\t') {
		end--
	}
	return end
}

// tokenBack returns the start of the token (RFC 9110 tchar) that ends s[:end].
func tokenBack(s string, end int) int {
	for end > 0 && isTchar(s[end-1]) {
		end--
	}
	return end
}

// isTchar reports whether c may appear in an RFC 9110 token.
func isTchar(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// quotedBack returns the index of the opening quote of the quoted string that ends
// s[:end] (s[end-1] is its closing quote): the nearest quote to the left that is not
// escaped, a quote being escaped when an odd number of backslashes precede it. ok is
// false when there is none, or when the closing quote is itself escaped.
func quotedBack(s string, end int) (int, bool) {
	if escapedAt(s, end-1) {
		return 0, false
	}
	for i := end - 2; i >= 0; i-- {
		if s[i] == '"' && !escapedAt(s, i) {
			return i, true
		}
	}
	return 0, false
}

// escapedAt reports whether an odd number of backslashes precede s[i].
func escapedAt(s string, i int) bool {
	n := 0
	for j := i - 1; j >= 0 && s[j] == '\\'; j-- {
		n++
	}
	return n%2 == 1
}

// unquote returns the content of the quoted string q (its quotes included), with its
// quoted pairs resolved; ok is false when it holds a character a quoted string may not
// (a control character other than HTAB, or DEL) or ends in a lone backslash.
func unquote(q string) (string, bool) {
	q = q[1 : len(q)-1]
	if strings.IndexByte(q, '\\') < 0 {
		for i := 0; i < len(q); i++ {
			if c := q[i]; c < ' ' && c != '\t' || c == 0x7f {
				return "", false
			}
		}
		return q, true
	}
	var b strings.Builder
	for i := 0; i < len(q); i++ {
		c := q[i]
		if c == '\\' {
			if i++; i == len(q) {
				return "", false
			}
			c = q[i]
		}
		if c < ' ' && c != '\t' || c == 0x7f {
			return "", false
		}
		b.WriteByte(c)
	}
	return b.String(), true
}
