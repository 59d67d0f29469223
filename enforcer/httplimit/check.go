package httplimit

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/streamlimit/streamlimit/enforcer"
	"github.com/streamlimit/streamlimit/enforcer/headers"
	"github.com/streamlimit/streamlimit/enforcer/rules"
)

// Check API limits.
const (
	// DefaultMaxBodyBytes is CheckOptions.MaxBodyBytes's default.
	DefaultMaxBodyBytes = 64 << 10
	// MaxHits is the largest hits_addend, Envoy's uint32 maximum.
	MaxHits = math.MaxUint32
)

// CheckOptions configure the check API handler.
type CheckOptions struct {
	// MaxBodyBytes bounds the request body; a larger one is answered 413. Default
	// DefaultMaxBodyBytes (64 KiB).
	MaxBodyBytes int64
	// ProblemType is the "type" of problem bodies for bad requests. Default "about:blank".
	ProblemType string
	// Logger defaults to discarding.
	Logger *slog.Logger
}

// CheckRequest is the body of POST /v1/check, the JSON shape of Envoy's RateLimitRequest:
//
//	{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"42"}]}],"hits_addend":1}
//
// The cost may be given as hits_addend, hitsAddend (protobuf JSON) or hits; 0 or absent
// means 1. A descriptor's own hits_addend, if given, must equal the request's; its limit
// override is ignored (rules come from the rules files only). max_delay_ms (at most
// MaxDelay) asks to wait that long for room rather than be refused (see Awaiter).
type CheckRequest struct {
	Domain          string            `json:"domain"`
	Descriptors     []CheckDescriptor `json:"descriptors"`
	HitsAddend      *int64            `json:"hits_addend,omitempty"`
	HitsAddendCamel *int64            `json:"hitsAddend,omitempty"`
	Hits            *int64            `json:"hits,omitempty"`
	MaxDelayMs      *int64            `json:"max_delay_ms,omitempty"`
}

// CheckDescriptor is one descriptor of a CheckRequest.
type CheckDescriptor struct {
	Entries         []CheckEntry    `json:"entries"`
	HitsAddend      *int64          `json:"hits_addend,omitempty"`
	HitsAddendCamel *int64          `json:"hitsAddend,omitempty"`
	Limit           json.RawMessage `json:"limit,omitempty"`
}

// CheckEntry is one key/value entry of a descriptor.
type CheckEntry struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// CheckResponse is the answer of POST /v1/check, in the shape of Envoy's
// RateLimitResponse with durations in milliseconds. It is sent with status 200 when
// OverallCode is "OK" and 429 when it is "OVER_LIMIT", with the fields of
// ResponseHeadersToAdd also set as HTTP header fields (Retry-After among them).
type CheckResponse struct {
	// OverallCode is "OK" or "OVER_LIMIT".
	OverallCode string `json:"overall_code"`
	// Statuses has one entry per request descriptor, in order.
	Statuses []CheckStatus `json:"statuses"`
	// ResponseHeadersToAdd are the fields of package headers that a gateway should add
	// to its response (RateLimit-Policy, RateLimit, X-RateLimit-*, Retry-After).
	ResponseHeadersToAdd []CheckHeader `json:"response_headers_to_add,omitempty"`
	// WaitedMs is how long the request waited for room (max_delay_ms); absent when it did
	// not wait.
	WaitedMs int64 `json:"waited_ms,omitempty"`
}

// CheckStatus is the decision for one descriptor (see enforcer.Status).
type CheckStatus struct {
	// Code is "OK" or "OVER_LIMIT".
	Code string `json:"code"`
	// CurrentLimit is the limit that decided; absent when no rule limits the descriptor.
	CurrentLimit *CheckLimit `json:"current_limit,omitempty"`
	// LimitRemaining is how many more requests the limit admits now;
	// headers.UnlimitedRemaining when the rule is unlimited.
	LimitRemaining int64 `json:"limit_remaining"`
	// DurationUntilResetMs is the time until the limit's counter is empty again, at most
	// headers.MaxRetryAfter.
	DurationUntilResetMs int64 `json:"duration_until_reset_ms"`
	// RetryAfterMs is 0 unless denied; then the time until a retry can succeed, at most
	// headers.MaxRetryAfter (a request that can never pass).
	RetryAfterMs int64 `json:"retry_after_ms"`
	// Rule is the ID of the matched rule; absent when none matched.
	Rule string `json:"rule,omitempty"`
	// Shadow reports that a shadow-mode limit would have denied.
	Shadow bool `json:"shadow"`
	// Soft reports an admission in the limit's soft band: past requests_per_unit, within
	// soft_percent (see enforcer.Status.Soft).
	Soft bool `json:"soft"`
	// Fallback reports a decision made by a fallback (see enforcer.Status).
	Fallback bool `json:"fallback"`
}

// CheckLimit describes a limit, like Envoy's RateLimitResponse.RateLimit.
type CheckLimit struct {
	// Name is the policy name of the RateLimit fields (headers.PolicyName).
	Name string `json:"name"`
	// RequestsPerUnit is the number of requests admitted per window.
	RequestsPerUnit int64 `json:"requests_per_unit"`
	// WindowSeconds is the window in seconds (fractional for sub-second windows).
	WindowSeconds float64 `json:"window_seconds"`
	// Unit is Envoy's unit ("SECOND", "MINUTE", ...) when the rule gives one.
	Unit string `json:"unit,omitempty"`
}

// CheckHeader is one header field to add.
type CheckHeader struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// checkError is a validation failure, answered 400.
type checkError struct{ msg string }

func (e *checkError) Error() string { return e.msg }

// NewCheckHandler returns the handler of POST /v1/check. A decision is answered with a
// CheckResponse, 200 when admitted and 429 when denied; a malformed or invalid request (bad JSON, unknown fields, bad
// hits, or a request rules.ValidateRequest rejects) is answered 400 with an
// application/problem+json body, a too large one 413, another method 405.
func NewCheckHandler(dec Decider, opts CheckOptions) http.Handler {
	if opts.MaxBodyBytes <= 0 {
		opts.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if opts.ProblemType == "" {
		opts.ProblemType = "about:blank"
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			writeProblem(w, http.StatusMethodNotAllowed, opts.ProblemType, "use POST")
			return
		}
		var maxDelay time.Duration
		req, err := decodeCheck(http.MaxBytesReader(w, r.Body, opts.MaxBodyBytes), &maxDelay)
		if err != nil {
			status := http.StatusBadRequest
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				status = http.StatusRequestEntityTooLarge
			}
			writeProblem(w, status, opts.ProblemType, err.Error())
			return
		}
		var res enforcer.Result
		waited := decideCheck(r.Context(), dec, req, maxDelay, &res)
		resp := checkResponse(&res)
		resp.WaitedMs = waited.Milliseconds()
		body, err := json.Marshal(resp)
		if err != nil {
			writeProblem(w, http.StatusInternalServerError, opts.ProblemType, "encoding the response failed")
			return
		}
		h := w.Header()
		for _, f := range headers.Append(nil, &res) {
			h.Set(f.Name, f.Value)
		}
		h.Set("Content-Type", "application/json")
		h.Set("Content-Length", strconv.Itoa(len(body)))
		h.Set("Cache-Control", "no-store")
		code := http.StatusOK
		if res.Code == enforcer.CodeOverLimit {
			code = http.StatusTooManyRequests
		}
		w.WriteHeader(code)
		if _, err := w.Write(body); err != nil {
			opts.Logger.LogAttrs(r.Context(), slog.LevelDebug, "writing check response", slog.Any("err", err))
		}
	})
}

// decodeCheck decodes and validates a check request; it sets *maxDelay from max_delay_ms.
func decodeCheck(body io.Reader, maxDelay *time.Duration) (enforcer.Request, error) {
	var cr CheckRequest
	d := json.NewDecoder(body)
	d.DisallowUnknownFields()
	if err := d.Decode(&cr); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return enforcer.Request{}, err
		}
		return enforcer.Request{}, fmt.Errorf("malformed JSON: %w", err)
	}
	if _, err := d.Token(); err != io.EOF {
		return enforcer.Request{}, &checkError{"malformed JSON: data after the request object"}
	}
	req := enforcer.Request{Domain: cr.Domain}
	// The shape is validated by rules.ValidateRequest, as over gRPC; JSON only adds the
	// cost's spellings. Entries are mapped first, bounded by the body's size.
	hits, err := pickHits("hits_addend", cr.HitsAddend, cr.HitsAddendCamel, cr.Hits)
	if err != nil {
		return req, err
	}
	req.Hits = hits
	if *maxDelay, err = checkDelay(cr.MaxDelayMs); err != nil {
		return req, err
	}
	for i, cd := range cr.Descriptors {
		f := "descriptors[" + strconv.Itoa(i) + "]"
		dh, err := pickHits(f+".hits_addend", cd.HitsAddend, cd.HitsAddendCamel, nil)
		if err != nil {
			return req, err
		}
		if (cd.HitsAddend != nil || cd.HitsAddendCamel != nil) && max(dh, 1) != max(hits, 1) {
			return req, &checkError{f + ".hits_addend: differs from the request's; one cost per request is supported"}
		}
		entries := make([]rules.Entry, len(cd.Entries))
		for j, e := range cd.Entries {
			entries[j] = rules.Entry{Key: e.Key, Value: e.Value}
		}
		req.Descriptors = append(req.Descriptors, entries)
	}
	if err := rules.ValidateRequest(req.Domain, req.Descriptors); err != nil {
		return req, err
	}
	return req, nil
}

// pickHits returns the one cost given among the spellings; several must agree.
func pickHits(field string, vs ...*int64) (int64, error) {
	var got *int64
	for _, v := range vs {
		if v == nil {
			continue
		}
		if *v < 0 || *v > MaxHits {
			return 0, &checkError{fmt.Sprintf("%s: %d is not in 0..%d", field, *v, int64(MaxHits))}
		}
		if got != nil && *got != *v {
			return 0, &checkError{field + ": given twice with different values"}
		}
		got = v
	}
	if got == nil {
		return 0, nil
	}
	return *got, nil
}

func checkResponse(res *enforcer.Result) CheckResponse {
	out := CheckResponse{OverallCode: res.Code.String(), Statuses: make([]CheckStatus, len(res.Statuses))}
	for i := range res.Statuses {
		st := &res.Statuses[i]
		cs := CheckStatus{Code: st.Code.String(), Shadow: st.Shadow, Soft: st.Soft(), Fallback: st.Fallback}
		if st.Rule != nil {
			cs.Rule = st.Rule.ID
		}
		if st.Limit != nil {
			cs.CurrentLimit = &CheckLimit{
				Name:            headers.PolicyName(st),
				RequestsPerUnit: st.Requests,
				WindowSeconds:   st.Window.Seconds(),
				Unit:            strings.ToUpper(st.Limit.Unit),
			}
			cs.LimitRemaining = max(st.Remaining, 0)
			cs.DurationUntilResetMs = headers.Millis(st.ResetAfter)
			cs.RetryAfterMs = headers.Millis(st.RetryAfter)
		} else if st.Rule != nil && st.Rule.Unlimited {
			cs.LimitRemaining = headers.UnlimitedRemaining
		}
		out.Statuses[i] = cs
	}
	for _, f := range headers.Append(nil, res) {
		out.ResponseHeadersToAdd = append(out.ResponseHeadersToAdd, CheckHeader{Key: f.Name, Value: f.Value})
	}
	return out
}

// writeProblem writes a problem body for a request error.
func writeProblem(w http.ResponseWriter, status int, typ, detail string) {
	body, _ := json.Marshal(struct {
		Type   string `json:"type"`
		Title  string `json:"title"`
		Status int    `json:"status"`
		Detail string `json:"detail"`
	}{typ, http.StatusText(status), status, detail})
	h := w.Header()
	h.Set("Content-Type", headers.ProblemContentType)
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}
