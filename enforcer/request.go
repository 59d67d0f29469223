package enforcer

import (
	"time"

	"github.com/streamlimit/streamlimit/enforcer/rules"
)

// Code is the outcome of a decision, numbered as Envoy's RateLimitResponse.Code.
type Code uint8

const (
	// CodeUnknown is the zero Code; a Result never carries it.
	CodeUnknown Code = iota
	// CodeOK admits the request.
	CodeOK
	// CodeOverLimit denies it.
	CodeOverLimit
)

// String returns "OK", "OVER_LIMIT" or "UNKNOWN".
func (c Code) String() string {
	switch c {
	case CodeOK:
		return "OK"
	case CodeOverLimit:
		return "OVER_LIMIT"
	}
	return "UNKNOWN"
}

// Request asks for admission, like Envoy's RateLimitRequest: a domain, one or more
// descriptors (each a list of entries, matched independently) and the request's cost.
type Request struct {
	// Domain selects the rules file.
	Domain string
	// Descriptors are matched independently; the request passes only if all pass.
	Descriptors [][]rules.Entry
	// Hits is the request's cost; 0 means 1.
	Hits int64
	// Overrides is nil, or holds one Override per descriptor: a descriptor whose Override
	// has a Window is limited by it instead of by the rules (see Override).
	Overrides []Override
}

// Result is the decision for a Request.
type Result struct {
	// Code is CodeOverLimit if any descriptor's status is, else CodeOK.
	Code Code
	// Statuses has one Status per descriptor, in order.
	Statuses []Status
}

// Status is the decision for one descriptor: the most restrictive of its limits in force.
type Status struct {
	// Code is CodeOverLimit when a non-shadow limit of the descriptor denied.
	Code Code
	// Rule is the rule that matched, nil when none did (the descriptor is not limited).
	Rule *rules.Rule
	// Limit is the limit that decided: the one that denied, else the one with the least
	// room left. Nil when the rule is unlimited or nothing matched.
	Limit *rules.Limit
	// Key is Limit's counter key.
	Key string
	// Requests is the number of requests Limit admits per Window, soft raise included.
	Requests int64
	// Window is Limit's window.
	Window time.Duration
	// Remaining is how many more requests of size 1 Limit would admit now.
	Remaining int64
	// ResetAfter is the time until Limit's counter is back to empty, assuming no other
	// traffic.
	ResetAfter time.Duration
	// RetryAfter is 0 unless the limit denied; then the time until a request of the same
	// cost would be admitted, assuming no other traffic (an estimate for global limits).
	RetryAfter time.Duration
	// Shadow reports that a limit of a shadow-mode rule would have denied; Code stays OK.
	Shadow bool
	// Fallback reports that the decision was made by a fallback: a site limit decided in
	// process because Redis failed, or a global limit decided on a local share because the
	// snapshot is stale.
	Fallback bool
}

// Soft reports that the status was admitted in its limit's soft band: past the limit's
// hard allowance (rules.Limit.HardAllowance) but within its soft raise (soft_percent), so
// that a client can be warned, billed or alerted on without a 429. Usage is read from the
// status as Requests − Remaining, the count after this request as the decision saw it.
// Elastic limits have no soft band.
func (st *Status) Soft() bool {
	lim := st.Limit
	if st.Code != CodeOK || lim == nil || lim.SoftPercent <= 0 || lim.Elastic != nil {
		return false
	}
	return st.Requests-max(st.Remaining, 0) > lim.HardAllowance()
}
