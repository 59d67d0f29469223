package httplimit

import (
	"encoding/json"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/streamlimit/streamlimit/enforcer"
	"github.com/streamlimit/streamlimit/enforcer/rules"
	"github.com/streamlimit/streamlimit/serve/headers"
)

// checkState is one check request's working memory, pooled by the handler so that a
// request in the common shape allocates little: the body, the decoded request, the
// descriptors handed to the Decider, the result, its header values and the answer.
type checkState struct {
	body   []byte
	cr     CheckRequest
	descs  []CheckDescriptor
	ints   [maxFastInts]int64
	nints  int
	rdescs [][]rules.Entry
	rents  []rules.Entry
	res    enforcer.Result
	costs  []int64 // each descriptor's cost, when they differ (see checkRequest)
	group  enforcer.Result
	gdescs [][]rules.Entry
	gidx   []int
	vals   headers.Values
	hdr    []byte
	out    []byte
}

// maxFastInts bounds the integers (costs and max_delay_ms) the fast decoder keeps; a
// request with more goes to encoding/json.
const maxFastInts = 16

// fastDecode decodes body into s.cr when it is in the plain shape clients send: the
// fields of CheckRequest spelled exactly, strings without escapes, integers without
// fraction or exponent, no nulls, no descriptor limit, every member once. It reports false
// for anything else, valid or not, which the caller then decodes with encoding/json, so
// that every request gets encoding/json's answer and every error its message. str is
// body as a string, whose substrings become the request's strings.
func (s *checkState) fastDecode(body []byte, str string) bool {
	s.cr = CheckRequest{}
	s.descs = s.descs[:0]
	s.rdescs = s.rdescs[:0]
	s.rents = s.rents[:0]
	s.nints = 0
	p := fastParser{b: body, s: str}
	// A field given twice is left to the slow path, which refuses it (checkNoDuplicates).
	var seen fields
	if !p.object(func(key string) bool {
		switch key {
		case "domain":
			var ok bool
			s.cr.Domain, ok = p.str()
			return seen.once(0) && ok
		case "descriptors":
			return seen.once(5) && s.fastDescriptors(&p)
		case "hits_addend":
			return seen.once(1) && s.fastInt(&p, &s.cr.HitsAddend)
		case "hitsAddend":
			return seen.once(2) && s.fastInt(&p, &s.cr.HitsAddendCamel)
		case "hits":
			return seen.once(3) && s.fastInt(&p, &s.cr.Hits)
		case "max_delay_ms":
			return seen.once(4) && s.fastInt(&p, &s.cr.MaxDelayMs)
		}
		return false
	}) {
		return false
	}
	p.space()
	if p.i != len(p.b) {
		return false
	}
	s.cr.Descriptors = s.descs
	return true
}

// fastDescriptors decodes the descriptors array.
func (s *checkState) fastDescriptors(p *fastParser) bool {
	s.cr.Descriptors = s.descs[:0] // non-nil once s.descs has grown: [] decodes as such
	return p.array(func() bool {
		d := CheckDescriptor{}
		var seen fields
		start := len(s.rents)
		if !p.object(func(key string) bool {
			switch key {
			case "entries":
				return seen.once(0) && s.fastEntries(p)
			case "hits_addend":
				return seen.once(1) && s.fastInt(p, &d.HitsAddend)
			case "hitsAddend":
				return seen.once(2) && s.fastInt(p, &d.HitsAddendCamel)
			}
			return false
		}) {
			return false
		}
		// s.rents may move as it grows; what it held stays where it was. The entries go
		// to the Decider as they are: d keeps only the costs checkRequest checks.
		s.rdescs = append(s.rdescs, s.rents[start:len(s.rents):len(s.rents)])
		s.descs = append(s.descs, d)
		return true
	})
}

// fastEntries decodes one descriptor's entries array, appending to s.rents.
func (s *checkState) fastEntries(p *fastParser) bool {
	return p.array(func() bool {
		var e rules.Entry
		var seen fields
		if !p.object(func(key string) bool {
			var ok bool
			switch key {
			case "key":
				e.Key, ok = p.str()
				ok = ok && seen.once(0)
			case "value":
				e.Value, ok = p.str()
				ok = ok && seen.once(1)
			}
			return ok
		}) {
			return false
		}
		s.rents = append(s.rents, e)
		return true
	})
}

// fields records which of an object's members (numbered by the decoder) were read, so
// that a member given twice fails the fast decoder: encoding/json would keep the last
// value, and the slow path refuses the body instead (checkNoDuplicates).
type fields uint8

// once marks member i read and reports whether it was not before.
func (f *fields) once(i uint) bool {
	if *f&(1<<i) != 0 {
		return false
	}
	*f |= 1 << i
	return true
}

// fastInt decodes an integer into one of s.ints and points *dst at it.
func (s *checkState) fastInt(p *fastParser, dst **int64) bool {
	if s.nints == len(s.ints) {
		return false
	}
	v, ok := p.int()
	if !ok {
		return false
	}
	s.ints[s.nints] = v
	*dst = &s.ints[s.nints]
	s.nints++
	return true
}

// fastParser reads the plain JSON fastDecode accepts; s is b as a string.
type fastParser struct {
	b []byte
	s string
	i int
}

func (p *fastParser) space() {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

// object reads an object, calling member with each member's name once its ':' is read,
// to read the value. It reports false when the object is not well formed or member
// reports false.
func (p *fastParser) object(member func(key string) bool) bool {
	if !p.byte('{') {
		return false
	}
	if p.peek('}') {
		return true
	}
	for {
		key, ok := p.str()
		if !ok || !p.byte(':') || !member(key) {
			return false
		}
		if p.peek('}') {
			return true
		}
		if !p.byte(',') {
			return false
		}
	}
}

// array reads an array, calling elem to read each element. It reports false when the
// array is not well formed or elem reports false.
func (p *fastParser) array(elem func() bool) bool {
	if !p.byte('[') {
		return false
	}
	if p.peek(']') {
		return true
	}
	for {
		if !elem() {
			return false
		}
		if p.peek(']') {
			return true
		}
		if !p.byte(',') {
			return false
		}
	}
}

// byte consumes c after optional white space.
func (p *fastParser) byte(c byte) bool {
	p.space()
	if p.i < len(p.b) && p.b[p.i] == c {
		p.i++
		return true
	}
	return false
}

// peek is byte, except that it consumes nothing when the next byte is not c.
func (p *fastParser) peek(c byte) bool {
	i := p.i
	if p.byte(c) {
		return true
	}
	p.i = i
	return false
}

// str reads a string without escapes or control characters, in valid UTF-8 (which
// encoding/json would change), as a substring of p.s.
func (p *fastParser) str() (string, bool) {
	if !p.byte('"') {
		return "", false
	}
	start := p.i
	ascii := true
	for ; p.i < len(p.b); p.i++ {
		c := p.b[p.i]
		switch {
		case c == '"':
			v := p.s[start:p.i]
			p.i++
			if !ascii && !utf8.ValidString(v) {
				return "", false
			}
			return v, true
		case c == '\\' || c < 0x20:
			return "", false
		case c >= utf8.RuneSelf:
			ascii = false
		}
	}
	return "", false
}

// int reads an integer in JSON's grammar of at most 18 digits, so that it cannot overflow
// an int64. A fraction or exponent after it fails the caller, which expects ',' or '}'.
func (p *fastParser) int() (int64, bool) {
	p.space()
	neg := p.i < len(p.b) && p.b[p.i] == '-'
	if neg {
		p.i++
	}
	start := p.i
	var v int64
	for p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' {
		v = v*10 + int64(p.b[p.i]-'0')
		p.i++
	}
	n := p.i - start
	if n == 0 || n > 18 || (n > 1 && p.b[start] == '0') {
		return 0, false
	}
	if neg {
		v = -v
	}
	return v, true
}

// appendCheckResponse appends res as the JSON of a CheckResponse, byte for byte what
// encoding/json.Marshal makes of checkResponse(res) with WaitedMs waitedMs; vals holds
// res's rendered header fields.
func appendCheckResponse(b []byte, res *enforcer.Result, vals *headers.Values, waitedMs int64) []byte {
	b = append(b, `{"overall_code":`...)
	b = appendJSONString(b, res.Code.String())
	b = append(b, `,"statuses":[`...)
	for i := range res.Statuses {
		st := &res.Statuses[i]
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"code":`...)
		b = appendJSONString(b, st.Code.String())
		var remaining, reset, retry int64
		if st.Limit != nil {
			b = append(b, `,"current_limit":{"name":`...)
			if st.Limit.Name != "" {
				b = appendJSONString(b, st.Limit.Name)
			} else {
				b = appendJSONString(b, headers.PolicyName(st))
			}
			b = append(b, `,"requests_per_unit":`...)
			b = strconv.AppendInt(b, st.Requests, 10)
			b = append(b, `,"window_seconds":`...)
			b = appendJSONFloat(b, st.Window.Seconds())
			if st.Limit.Unit != "" {
				b = append(b, `,"unit":`...)
				b = appendJSONString(b, upper(st.Limit.Unit))
			}
			b = append(b, '}')
			remaining = max(st.Remaining, 0)
			reset = headers.Millis(st.ResetAfter)
			retry = headers.Millis(st.RetryAfter)
		} else if st.Rule != nil && st.Rule.Unlimited {
			remaining = headers.UnlimitedRemaining
		}
		b = append(b, `,"limit_remaining":`...)
		b = strconv.AppendInt(b, remaining, 10)
		b = append(b, `,"duration_until_reset_ms":`...)
		b = strconv.AppendInt(b, reset, 10)
		b = append(b, `,"retry_after_ms":`...)
		b = strconv.AppendInt(b, retry, 10)
		if st.Rule != nil && st.Rule.ID != "" {
			b = append(b, `,"rule":`...)
			b = appendJSONString(b, st.Rule.ID)
		}
		b = append(b, `,"shadow":`...)
		b = strconv.AppendBool(b, st.Shadow)
		b = append(b, `,"soft":`...)
		b = strconv.AppendBool(b, st.Soft())
		b = append(b, `,"fallback":`...)
		b = strconv.AppendBool(b, st.Fallback)
		b = append(b, '}')
	}
	b = append(b, ']')
	if n := vals.Len(); n > 0 {
		b = append(b, `,"response_headers_to_add":[`...)
		for i := range n {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"key":`...)
			b = appendJSONString(b, vals.Name(i))
			b = append(b, `,"value":`...)
			b = appendJSONString(b, vals.Value(i))
			b = append(b, '}')
		}
		b = append(b, ']')
	}
	if waitedMs != 0 {
		b = append(b, `,"waited_ms":`...)
		b = strconv.AppendInt(b, waitedMs, 10)
	}
	return append(b, '}')
}

// upper is strings.ToUpper without its allocation for the units the rules spell in
// lower case ("second", "minute", ...): their upper-case forms are constants.
func upper(unit string) string {
	switch unit {
	case "second":
		return "SECOND"
	case "minute":
		return "MINUTE"
	case "hour":
		return "HOUR"
	case "day":
		return "DAY"
	case "week":
		return "WEEK"
	case "month":
		return "MONTH"
	case "year":
		return "YEAR"
	}
	return strings.ToUpper(unit)
}

// jsonPlain reports whether encoding/json writes c as itself inside a string: printable
// ASCII and DEL other than the quote, the backslash and the characters it escapes for
// HTML ('<', '>', '&'). The two masks hold one bit per byte value below 128.
func jsonPlain(c byte) bool {
	const (
		lo uint64 = 0xffffffff_00000000 &^ (1<<'"' | 1<<'&' | 1<<'<' | 1<<'>') // 0x00–0x3f
		hi uint64 = 0xffffffff_ffffffff &^ (1 << ('\\' - 64))                  // 0x40–0x7f
	)
	if c < 64 {
		return lo>>c&1 != 0
	}
	return c < 128 && hi>>(c-64)&1 != 0
}

// appendJSONString appends s as encoding/json.Marshal writes a string. Only '"' and '\'
// are escaped here; a string with other bytes to escape (control characters, HTML
// characters, non-ASCII) is rare in an answer and left to encoding/json.
func appendJSONString[T string | []byte](b []byte, s T) []byte {
	n0 := len(b)
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if jsonPlain(c) {
			continue
		}
		if c != '"' && c != '\\' {
			q, _ := json.Marshal(string(s))
			return append(b[:n0], q...)
		}
		b = append(b, s[start:i]...)
		b = append(b, '\\', c)
		start = i + 1
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// appendJSONFloat appends f as encoding/json writes a float64: the shortest form, in
// exponent notation below 1e-6 and from 1e21, with the exponent's leading zero dropped.
// f is a window's length, never NaN or infinite.
func appendJSONFloat(b []byte, f float64) []byte {
	format := byte('f')
	if a := math.Abs(f); a != 0 && (a < 1e-6 || a >= 1e21) {
		format = 'e'
	}
	b = strconv.AppendFloat(b, f, format, -1, 64)
	if format == 'e' {
		// "1e-07" → "1e-7", as encoding/json does.
		if n := len(b); n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b
}
