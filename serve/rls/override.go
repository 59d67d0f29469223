package rls

import (
	"fmt"
	"math"
	"strconv"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/streamlimit/streamlimit/enforcer"
	"github.com/streamlimit/streamlimit/enforcer/rules"
)

// OverrideMode says what the Server does with a descriptor's own limit (Envoy's
// per-descriptor RateLimitOverride, the descriptor's limit field).
type OverrideMode uint8

const (
	// HonourOverrides limits such a descriptor by its own limit instead of the rules'
	// (enforcer.Override), as envoyproxy/ratelimit does. It is the default.
	HonourOverrides OverrideMode = iota
	// IgnoreOverrides leaves the rules to decide and counts the descriptor in
	// streamlimit_rls_ignored_total{feature="limit_override"}: a caller that may choose
	// its own limit may raise its own quota.
	IgnoreOverrides
)

// overrideModeNames are the names ParseOverrideMode takes, indexed by mode.
var overrideModeNames = [...]string{HonourOverrides: "honour", IgnoreOverrides: "ignore"}

// String returns "honour" or "ignore".
func (m OverrideMode) String() string {
	if int(m) < len(overrideModeNames) {
		return overrideModeNames[m]
	}
	return "OverrideMode(" + strconv.Itoa(int(m)) + ")"
}

// ParseOverrideMode returns the mode named s: "honour" or "ignore".
func ParseOverrideMode(s string) (OverrideMode, error) {
	for i, n := range overrideModeNames {
		if n == s {
			return OverrideMode(i), nil
		}
	}
	return 0, fmt.Errorf("limit overrides %q: want honour or ignore", s)
}

// override maps descriptor i's limit lo to an enforcer.Override, the zero Override when
// overrides are ignored. A unit that is not one of Envoy's (UNKNOWN, or a number no unit
// has) or a unit_multiplier of 0 is an error naming the field: envoyproxy/ratelimit has
// no answer for them (an unknown unit stops its process), and guessing a window could
// admit more than the caller meant. A unit_multiplier, which envoyproxy/ratelimit does
// not read, multiplies the unit, as Envoy defines it.
func (s *Server) override(lo *ratelimitv3.RateLimitDescriptor_RateLimitOverride, i int) (enforcer.Override, error) {
	if s.opts.Overrides == IgnoreOverrides {
		s.metrics.ignored(featureOverride)
		s.opts.Logger.Debug("rate limit override ignored; the configured rules decide")
		return enforcer.Override{}, nil
	}
	field := "descriptors[" + strconv.Itoa(i) + "].limit"
	unit, ok := overrideUnit(lo.GetUnit())
	if !ok {
		return enforcer.Override{}, &rules.RequestError{Field: field + ".unit", Reason: fmt.Sprintf("%v is not a unit (SECOND, MINUTE, HOUR, DAY, MONTH or YEAR)", lo.GetUnit())}
	}
	w, _ := rules.UnitDuration(unit)
	if m := lo.GetUnitMultiplier(); m != nil {
		if m.GetValue() == 0 {
			return enforcer.Override{}, &rules.RequestError{Field: field + ".unit_multiplier", Reason: "must be at least 1"}
		}
		if uint64(m.GetValue()) > uint64(math.MaxInt64/w) {
			return enforcer.Override{}, &rules.RequestError{Field: field + ".unit_multiplier", Reason: "the window overflows"}
		}
		w *= time.Duration(m.GetValue())
	}
	return enforcer.Override{Requests: int64(lo.GetRequestsPerUnit()), Window: w}, nil
}

// overrideUnit names the rules' unit of an Envoy unit.
func overrideUnit(u typev3.RateLimitUnit) (string, bool) {
	switch u {
	case typev3.RateLimitUnit_SECOND:
		return "second", true
	case typev3.RateLimitUnit_MINUTE:
		return "minute", true
	case typev3.RateLimitUnit_HOUR:
		return "hour", true
	case typev3.RateLimitUnit_DAY:
		return "day", true
	case typev3.RateLimitUnit_MONTH:
		return "month", true
	case typev3.RateLimitUnit_YEAR:
		return "year", true
	}
	return "", false
}
