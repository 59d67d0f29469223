// Package headers renders a decision as the HTTP fields a throttled client sees: the IETF
// RateLimit-Policy and RateLimit fields of draft-ietf-httpapi-ratelimit-headers-10, the
// de-facto X-RateLimit-* fields and Retry-After. The net/http middleware, the nginx
// auth_request endpoint and the Envoy gRPC service all use it, so every integration sends
// the same fields. Values.Render renders them for a Result; Primary picks the status
// they describe.
//
// The fields, with an example and their parameters: docs/api.md, "Rate-limit header
// fields".
package headers

import (
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/streamlimit/streamlimit/enforcer"
	"github.com/streamlimit/streamlimit/enforcer/rules"
)

// Field names.
const (
	RateLimitPolicy    = "RateLimit-Policy"
	RateLimit          = "RateLimit"
	XRateLimitLimit    = "X-RateLimit-Limit"
	XRateLimitRemain   = "X-RateLimit-Remaining"
	XRateLimitReset    = "X-RateLimit-Reset"
	RetryAfter         = "Retry-After"
	ProblemContentType = "application/problem+json"
)

// Field is one HTTP header field.
type Field struct {
	Name  string
	Value string
}

// PolicyName returns the name of the policy of a status's limit as it appears in the
// RateLimit fields: the limit's name when the rules give one, else the rule ID and the
// window, e.g. "api.user-60s". It returns "" when the status has no limit.
func PolicyName(st *enforcer.Status) string {
	if st.Limit == nil {
		return ""
	}
	if st.Limit.Name != "" {
		return st.Limit.Name
	}
	return string(appendPolicyName(nil, st))
}

func appendPolicyName(dst []byte, st *enforcer.Status) []byte {
	return appendPolicy(dst, policy{st.Rule, st.Limit})
}

// policy is one limit as advertised: the limit and the rule it belongs to (nil for a
// pool's limit).
type policy struct {
	rule  *rules.Rule
	limit *rules.Limit
}

func appendPolicy(dst []byte, p policy) []byte {
	if p.limit.Name != "" {
		return append(dst, p.limit.Name...)
	}
	id := "limit"
	if p.rule != nil {
		id = p.rule.ID
	}
	dst = append(dst, id...)
	dst = append(dst, '-')
	return append(dst, p.limit.WindowTag()...)
}

// same reports whether a and b have the same policy name, without building it.
func (a policy) same(b policy) bool {
	if a.limit == b.limit {
		return true
	}
	if a.limit.Name != "" || b.limit.Name != "" {
		return a.limit.Name == b.limit.Name
	}
	ida, idb := "limit", "limit"
	if a.rule != nil {
		ida = a.rule.ID
	}
	if b.rule != nil {
		idb = b.rule.ID
	}
	return ida == idb && a.limit.WindowTag() == b.limit.WindowTag()
}

// quota returns the q and w of a limit that did not decide its descriptor, as the
// enforcer states them for one that did: requests per window with the soft raise, and for
// a global limit its counting window and allowance there.
func (p policy) quota() (int64, time.Duration) {
	if p.limit.Scope == rules.Global {
		return p.limit.CountAllowance(), p.limit.CountWindow()
	}
	return p.limit.CountAllowance(), p.limit.Window
}

// visible reports whether st is advertised to clients: it has a limit and its rule is not
// in shadow mode.
func visible(st *enforcer.Status) bool {
	return st.Limit != nil && (st.Rule == nil || !st.Rule.ShadowMode)
}

// worse reports whether a is more restrictive than b: denied beats admitted, then the
// longer RetryAfter among denied, the smaller Remaining among admitted.
func worse(a, b *enforcer.Status) bool {
	ad, bd := a.Code == enforcer.CodeOverLimit, b.Code == enforcer.CodeOverLimit
	switch {
	case ad != bd:
		return ad
	case ad:
		return a.RetryAfter > b.RetryAfter
	default:
		return a.Remaining < b.Remaining
	}
}

// Primary returns the status that speaks for the whole result: the denying one with the
// longest RetryAfter, else the limited one with the least Remaining. Statuses of
// shadow-mode rules never speak. It returns nil when no descriptor is visibly limited.
func Primary(res *enforcer.Result) *enforcer.Status {
	var best *enforcer.Status
	for i := range res.Statuses {
		st := &res.Statuses[i]
		if !visible(st) {
			continue
		}
		if best == nil || worse(st, best) {
			best = st
		}
	}
	return best
}

// MaxRetryAfter is the longest wait that any front door reports (Retry-After, the t
// parameter, retry_after_ms, duration_until_reset): one year, the longest unit of the
// rules. A request that can never be admitted — a limit of 0, or a cost above the limit —
// has no time at which a retry succeeds; it is told to come back after MaxRetryAfter
// rather than after a duration that overflows its encoding.
const MaxRetryAfter = 365 * 24 * time.Hour

// UnlimitedRemaining is the limit_remaining that the check API, /json and gRPC report for
// a descriptor whose rule is unlimited, as envoyproxy/ratelimit does: the largest value of
// the protocol's uint32 field.
const UnlimitedRemaining = math.MaxUint32

// Cap returns d limited to 0..MaxRetryAfter.
func Cap(d time.Duration) time.Duration { return min(max(d, 0), MaxRetryAfter) }

// Seconds rounds d up to whole seconds, as Retry-After and the t and w parameters need:
// rounding down would invite a retry that is still too early. It is at most
// MaxRetryAfter's seconds.
func Seconds(d time.Duration) int64 {
	d = Cap(d)
	return int64((d + time.Second - 1) / time.Second)
}

// Millis rounds d up to whole milliseconds, capped like Seconds.
func Millis(d time.Duration) int64 {
	d = Cap(d)
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// MaxFields is the most fields a Result renders to.
const MaxFields = 6

var names = [MaxFields]string{RateLimitPolicy, RateLimit, XRateLimitLimit, XRateLimitRemain, XRateLimitReset, RetryAfter}

// Values is the rendering of one Result's fields into a reusable buffer, for callers that
// must not allocate per request. The zero Values is ready to use; Render does not allocate
// once the buffer has grown to the size of the results it renders. A Values is not safe
// for simultaneous use; pool it or keep one per goroutine.
type Values struct {
	buf  []byte
	ends [MaxFields]int
	n    int
}

// Len returns the number of fields of the last Render: 0 (nothing visibly limited), 5
// (admitted) or 6 (denied: Retry-After too).
func (v *Values) Len() int { return v.n }

// Name returns the name of field i, 0 ≤ i < Len(). Fields come in the order
// RateLimit-Policy, RateLimit, X-RateLimit-Limit, X-RateLimit-Remaining,
// X-RateLimit-Reset, Retry-After.
func (v *Values) Name(i int) string { return names[i] }

// Value returns the value of field i. It aliases the buffer and is valid until the next
// Render.
func (v *Values) Value(i int) []byte { return v.buf[v.start(i):v.ends[i]] }

// Bytes returns all values back to back; field i spans Span(i). It aliases the buffer,
// so that a caller can convert it to one string and slice that.
func (v *Values) Bytes() []byte { return v.buf }

// Span returns where the value of field i lies in Bytes.
func (v *Values) Span(i int) (start, end int) { return v.start(i), v.ends[i] }

func (v *Values) start(i int) int {
	if i == 0 {
		return 0
	}
	return v.ends[i-1]
}

// Render renders res and returns Len(). See docs/api.md for the fields.
func (v *Values) Render(res *enforcer.Result) int {
	v.buf = v.buf[:0]
	v.n = 0
	p := Primary(res)
	if p == nil {
		return 0
	}
	// RateLimit-Policy: every limit that applied, once, in the order of first appearance.
	first := true
	for i := range res.Statuses {
		st := &res.Statuses[i]
		if !visible(st) {
			continue
		}
		first = v.appendPolicyItem(res, i, policy{st.Rule, st.Limit}, st.Requests, st.Window, first)
		if st.Rule == nil {
			continue
		}
		for k := range st.Rule.Limits {
			lim := &st.Rule.Limits[k]
			if lim == st.Limit || replaced(res, lim) {
				continue
			}
			q, w := policy{st.Rule, lim}.quota()
			first = v.appendPolicyItem(res, i, policy{st.Rule, lim}, q, w, first)
		}
	}
	v.ends[0] = len(v.buf)
	// RateLimit: the state of the limit closest to exhaustion.
	v.buf = appendSFString(v.buf, policy{p.Rule, p.Limit})
	t := p.ResetAfter
	if p.Code == enforcer.CodeOverLimit {
		t = p.RetryAfter
	}
	v.buf = append(v.buf, ";r="...)
	v.buf = strconv.AppendInt(v.buf, max(p.Remaining, 0), 10)
	v.buf = append(v.buf, ";t="...)
	v.buf = strconv.AppendInt(v.buf, Seconds(t), 10)
	if p.Soft() {
		v.buf = append(v.buf, ";soft"...)
	}
	v.ends[1] = len(v.buf)
	v.buf = strconv.AppendInt(v.buf, max(p.Requests, 0), 10)
	v.ends[2] = len(v.buf)
	v.buf = strconv.AppendInt(v.buf, max(p.Remaining, 0), 10)
	v.ends[3] = len(v.buf)
	v.buf = strconv.AppendInt(v.buf, Seconds(p.ResetAfter), 10)
	v.ends[4] = len(v.buf)
	v.n = 5
	if res.Code == enforcer.CodeOverLimit {
		// A denied result whose primary status admitted (a race between check and commit,
		// see package enforcer) still says when to come back: at least in one second.
		v.buf = strconv.AppendInt(v.buf, max(Seconds(p.RetryAfter), 1), 10)
		v.ends[5] = len(v.buf)
		v.n = 6
	}
	return v.n
}

// appendPolicyItem appends pol as an item of RateLimit-Policy unless a policy of the same
// name was already listed: by a status before i, or earlier in status i. It returns
// whether the field is still empty.
func (v *Values) appendPolicyItem(res *enforcer.Result, i int, pol policy, q int64, w time.Duration, first bool) bool {
	if listedBefore(res, i, pol) {
		return first
	}
	if !first {
		v.buf = append(v.buf, ", "...)
	}
	v.buf = appendSFString(v.buf, pol)
	v.buf = append(v.buf, ";q="...)
	v.buf = strconv.AppendInt(v.buf, max(q, 0), 10)
	v.buf = append(v.buf, ";w="...)
	v.buf = strconv.AppendInt(v.buf, Seconds(w), 10)
	return false
}

// listedBefore reports whether pol is among the policies listed before it: those of the
// visible statuses before i, and those of status i before pol (its deciding limit first,
// then its rule's limits in order).
func listedBefore(res *enforcer.Result, i int, pol policy) bool {
	for j := range i + 1 {
		st := &res.Statuses[j]
		if !visible(st) {
			continue
		}
		if cur := (policy{st.Rule, st.Limit}); cur.same(pol) {
			return j < i || cur.limit != pol.limit
		}
		if st.Rule == nil {
			continue
		}
		for k := range st.Rule.Limits {
			lim := &st.Rule.Limits[k]
			if j == i && lim == pol.limit {
				return false
			}
			if lim == st.Limit || replaced(res, lim) {
				continue
			}
			if (policy{st.Rule, lim}).same(pol) {
				return true
			}
		}
	}
	return false
}

// replaced reports whether lim is replaced by a limit of another matched, visible rule
// (replaces: in the rules), and so did not apply.
func replaced(res *enforcer.Result, lim *rules.Limit) bool {
	if lim.Name == "" {
		return false
	}
	for i := range res.Statuses {
		st := &res.Statuses[i]
		if !visible(st) || st.Rule == nil {
			continue
		}
		for k := range st.Rule.Limits {
			if slices.Contains(st.Rule.Limits[k].Replaces, lim.Name) {
				return true
			}
		}
	}
	return false
}

// Append appends the fields for res to dst: RateLimit-Policy and RateLimit with one item
// per visibly limited policy, X-RateLimit-Limit/Remaining/Reset of the primary status, and
// Retry-After when the request is denied. A result with no visibly limited descriptor
// adds nothing.
func Append(dst []Field, res *enforcer.Result) []Field {
	var v Values
	n := v.Render(res)
	if n == 0 {
		return dst
	}
	all := string(v.Bytes())
	for i := range n {
		s, e := v.Span(i)
		dst = append(dst, Field{names[i], all[s:e]})
	}
	return dst
}

// appendSFString appends p's name as a Structured Field String (RFC 9651
// §3.3.3): printable ASCII in quotes with '"' and '\' escaped; other bytes are replaced by
// '?' since sf-strings cannot carry them.
func appendSFString(dst []byte, p policy) []byte {
	dst = append(dst, '"')
	start := len(dst)
	dst = appendPolicy(dst, p)
	// Escape in place, growing as needed; names rarely need it.
	for i := start; i < len(dst); i++ {
		c := dst[i]
		switch {
		case c == '"' || c == '\\':
			dst = append(dst, 0)
			copy(dst[i+1:], dst[i:])
			dst[i] = '\\'
			i++
		case c < 0x20 || c > 0x7e:
			dst[i] = '?'
		}
	}
	return append(dst, '"')
}
