// Package rls serves an enforcer.Engine as Envoy's rate limit service: the gRPC method
// envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit, with the official
// go-control-plane messages, so that Envoy's ratelimit filters (HTTP, network, Thrift) and
// any other RLS client can use streamlimit in place of envoyproxy/ratelimit.
//
// # Request
//
// The domain and each descriptor's entries go to the Limiter unchanged; descriptors are
// matched independently and the request passes only if all pass (as in
// envoyproxy/ratelimit, and the Limiter's all-or-nothing rule).
//
// The cost of a descriptor is its own hits_addend when set, else the request's
// hits_addend; 0 (or unset) means 1, since the Limiter has no way to look without taking.
// When every descriptor has the same cost, the whole request is one Limiter decision and is
// all or nothing. When costs differ, the descriptors are decided in groups of equal cost,
// in the order in which each cost first appears; a group that is denied stops the request,
// so that later groups take nothing, but groups already admitted keep what they took.
// Descriptors of groups that were not decided are reported OK with no current_limit.
//
// A descriptor's own limit (limit, Envoy's RateLimitOverride) is honoured by default, as
// envoyproxy/ratelimit honours it: the descriptor is limited by requests_per_unit per
// unit (times unit_multiplier, when set) instead of by its rule, in the scope and with the
// algorithm of the rule's first limit (global sliding_window when no rule matches), on a
// counter of its own (see enforcer.Override); 0 requests denies every request. A unit
// that is not one of Envoy's (UNKNOWN, or an undefined number) or a unit_multiplier of 0
// is InvalidArgument. Such descriptors are counted in
// streamlimit_rls_limit_overrides_total. Since a caller that sets its own limit can raise
// its own quota, Options.Overrides = IgnoreOverrides lets the rules decide instead and
// counts such descriptors in streamlimit_rls_ignored_total{feature="limit_override"}.
//
// Refunds (is_negative_hits) are not supported: such a descriptor takes nothing and is
// reported OK with no current_limit, since the Limiter's counters only grow; it is counted
// in streamlimit_rls_ignored_total{feature="negative_hits"}.
//
// A request (outside compat: envoy, below) that rules.ValidateRequest rejects (an empty domain, no descriptors or more
// than rules.MaxRequestDescriptors, a descriptor with no entries or more than
// rules.MaxDescriptorEntries, an entry with an empty key) is answered with gRPC status
// InvalidArgument and the same message as the HTTP check API's 400. The Limiter itself
// never fails.
//
// # Response
//
// overall_code is OVER_LIMIT when any descriptor's is, else OK. Each status has:
//
//   - code: OK or OVER_LIMIT. A shadow-mode rule that would have denied is reported OK,
//     as envoyproxy/ratelimit does for its per-rule shadow_mode.
//   - current_limit, for a descriptor with a limit in force (the one that denied, else the
//     one with the least room): requests_per_unit is the limit's requests per window (soft
//     raise included, capped at 2³²−1); unit and unit_multiplier express the window in the
//     largest Envoy unit that divides it exactly (week = 7 days, month = 30 days,
//     year = 365 days, as the rules count them), so 1m is MINUTE, 10m is MINUTE×10 and 7d
//     is WEEK; a window that no unit divides (1500ms) is UNKNOWN. name is the policy name
//     of the RateLimit fields (headers.PolicyName): the limit's name, else the rule ID and
//     window.
//   - limit_remaining: how many more requests of cost 1 the limit admits now.
//   - duration_until_reset: when denied, the time until a request of the same cost would be
//     admitted (Status.RetryAfter); else the time until the limit's counter is empty
//     (Status.ResetAfter). A denied client reads it as "retry after", which is what
//     envoyproxy/ratelimit's end-of-fixed-window means too.
//
// A descriptor that matched no rule gets code OK and nothing else; one that matched an
// unlimited rule gets code OK and limit_remaining 2³²−1, as in envoyproxy/ratelimit.
//
// response_headers_to_add carries the fields of package headers (RateLimit-Policy,
// RateLimit, X-RateLimit-*, and Retry-After when denied), on allowed responses too, so that
// clients behind Envoy see what clients of the HTTP middleware see.
// request_headers_to_add, raw_body, dynamic_metadata and quota are left empty.
//
// # compat: envoy
//
// A request to a domain in rules.CompatEnvoy (or to a domain no file configures, with
// Options.Compat so) is answered as envoyproxy/ratelimit answers it; docs/envoy-compat.md
// lists every difference. Its rules are matched as above, with replaces; then:
//
//   - A rule whose limits in force are all fixed windows in local or site scope outside
//     any pool (the defaults of such a domain) is counted as envoyproxy/ratelimit counts:
//     each of its limits adds the descriptor's cost to its window, over the limit or not
//     (envoyCount: the Limiter's stores with a ceiling no count reaches, so that they add
//     as INCRBY adds), and is over when its count is above the limit. With
//     EnvoyOptions.StopIncrementWhenOverLimit the counts are read first and, when the
//     request would take a limit over, only such limits add it. A descriptor's own
//     hits_addend of 0 reads; is_negative_hits is not read.
//   - The other rules (streamlimit's extensions: global scope, other algorithms, pools)
//     are decided by the Limiter, all of them together, in groups of equal cost (0 taken
//     as 1), and answered in envoyproxy/ratelimit's form. Between the two kinds, replaces
//     leaves out a rule all of whose limits are replaced; the Limiter applies it within
//     its own rules.
//   - A descriptor's own limit is a fixed window of requests_per_unit per unit
//     (unit_multiplier is not read), without a name, on a counter of its own, in a domain
//     the rules configure.
//   - The answer: current_limit named by the limit's name: only; limit_remaining 0 when
//     over; duration_until_reset the whole seconds to the end of the window; a shadow-mode
//     rule over its limit answered OK; one in quota mode (or with EnvoyOptions.QuotaMode)
//     answered OK without duration_until_reset and listed in the dynamic metadata;
//     response_headers_to_add empty unless EnvoyOptions.ResponseHeaders. An empty domain
//     or descriptor list is refused with code Unknown and envoyproxy/ratelimit's message;
//     descriptors without entries and entries without a key match nothing; the bounds on
//     the number of descriptors and entries stay.
//
// Such decisions are counted in streamlimit_rls_envoy_decisions_total{domain,rule,result}.
//
// # Metrics
//
// streamlimit_rls_requests_total{result} counts calls by result (ok, over_limit,
// invalid); streamlimit_rls_limit_overrides_total counts descriptors limited by their
// own limit; streamlimit_rls_ignored_total{feature} counts descriptors whose
// limit_override or negative_hits was ignored. Per-rule decisions are counted by the
// Limiter's own metrics (a descriptor limited by its own limit has no rule and is not
// counted there).
package rls
