package httplimit

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/streamlimit/streamlimit/enforcer"
	"github.com/streamlimit/streamlimit/enforcer/rules"
	"github.com/streamlimit/streamlimit/serve/headers"
)

// Check API limits.
const (
	// DefaultMaxBodyBytes is CheckOptions.MaxBodyBytes's default.
	DefaultMaxBodyBytes = 64 << 10
	// DefaultCheckWriteTimeout is CheckOptions.WriteTimeout's default, the enforcer's
	// default write timeout.
	DefaultCheckWriteTimeout = 10 * time.Second
	// MaxHits is the largest hits_addend, Envoy's uint32 maximum, as on every front door.
	MaxHits = rules.MaxHits
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
	// WriteTimeout is how long the server in which the handler runs gives an answer to
	// be written (http.Server.WriteTimeout, from the end of the request's headers). A
	// request that asks to wait for room (max_delay_ms) is answered up to that wait
	// later: its connection's deadlines are moved to the wait plus WriteTimeout, so that
	// the wait ends in an answer rather than in the connection closed at the server's
	// write deadline (the client would see only EOF) or the request's context cancelled
	// at its read deadline. Default DefaultCheckWriteTimeout.
	WriteTimeout time.Duration
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
	if opts.WriteTimeout <= 0 {
		opts.WriteTimeout = DefaultCheckWriteTimeout
	}
	pool := sync.Pool{New: func() any { return new(checkState) }}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			writeProblem(w, http.StatusMethodNotAllowed, opts.ProblemType, "use POST")
			return
		}
		if r.ContentLength > opts.MaxBodyBytes {
			// Declared too large: answered before reading any of it.
			w.Header().Set("Connection", "close")
			writeProblem(w, http.StatusRequestEntityTooLarge, opts.ProblemType, fmt.Sprintf("the body is larger than %d bytes", opts.MaxBodyBytes))
			return
		}
		s := pool.Get().(*checkState)
		defer pool.Put(s)
		var maxDelay time.Duration
		req, err := s.decode(http.MaxBytesReader(w, r.Body, opts.MaxBodyBytes), &maxDelay, &s.costs)
		if err != nil {
			status := http.StatusBadRequest
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				status = http.StatusRequestEntityTooLarge
			}
			writeProblem(w, status, opts.ProblemType, err.Error())
			return
		}
		if maxDelay > 0 {
			allowWait(w, r, maxDelay+opts.WriteTimeout, opts.Logger)
		}
		res := &s.res
		var waited time.Duration
		if len(s.costs) > 0 {
			waited = s.decideGroups(r.Context(), dec, req, maxDelay)
		} else {
			waited = decideCheck(r.Context(), dec, req, maxDelay, res)
		}
		n := s.vals.Render(res)
		s.out = appendCheckResponse(s.out[:0], res, &s.vals, waited.Milliseconds())
		// One string holds every header value, the Content-Length's among them, and one
		// slice backs every field's []string: two allocations for all the fields.
		s.hdr = strconv.AppendInt(append(s.hdr[:0], s.vals.Bytes()...), int64(len(s.out)), 10)
		all := string(s.hdr)
		backing := make([]string, n+3)
		h := w.Header()
		for i := range n {
			start, end := s.vals.Span(i)
			backing[i] = all[start:end]
			h[canonical[i]] = backing[i : i+1 : i+1]
		}
		backing[n], backing[n+1], backing[n+2] = "application/json", all[len(s.vals.Bytes()):], "no-store"
		h["Content-Type"] = backing[n : n+1 : n+1]
		h["Content-Length"] = backing[n+1 : n+2 : n+2]
		h["Cache-Control"] = backing[n+2 : n+3 : n+3]
		code := http.StatusOK
		if res.Code == enforcer.CodeOverLimit {
			code = http.StatusTooManyRequests
		}
		w.WriteHeader(code)
		if _, err := w.Write(s.out); err != nil {
			opts.Logger.LogAttrs(r.Context(), slog.LevelDebug, "writing check response", slog.Any("err", err))
		}
	})
}

// allowWait moves the deadlines of r's connection to d from now, for a request that may
// wait for room: the server set them for an answer at once, and a wait past its write
// deadline would end in the connection closed without an answer, a wait past its read
// deadline in the request's context cancelled (the server's background read fails, and
// takes that for the client gone). The deadlines are the network's, on the wall clock.
// The server resets them for the connection's next request. A writer that cannot move
// them (not a server's connection) keeps its own.
func allowWait(w http.ResponseWriter, r *http.Request, d time.Duration, log *slog.Logger) {
	rc := http.NewResponseController(w)
	at := time.Now().Add(d)
	for _, set := range []func(time.Time) error{rc.SetWriteDeadline, rc.SetReadDeadline} {
		if err := set(at); err != nil && !errors.Is(err, http.ErrNotSupported) {
			log.LogAttrs(r.Context(), slog.LevelDebug, "moving the connection's deadline for a wait", slog.Any("err", err))
		}
	}
}

// decode reads the body and decodes it with fastDecode, or, when the body is not in the
// shape fastDecode takes or could not be read whole, with decodeCheck, whose answer and
// errors are then those of encoding/json reading the body as it came. The request's
// strings share one string of the body, and its descriptors s's memory, valid until s
// is reused.
func (s *checkState) decode(body io.Reader, maxDelay *time.Duration, costs *[]int64) (enforcer.Request, error) {
	buf := bytes.NewBuffer(s.body[:0])
	_, rerr := buf.ReadFrom(body)
	s.body = buf.Bytes()
	if rerr != nil {
		// What was read, then the error, as decodeCheck would have met them.
		return decodeCheck(io.MultiReader(bytes.NewReader(s.body), errReader{rerr}), maxDelay, costs)
	}
	str := string(s.body)
	if !s.fastDecode(s.body, str) {
		return decodeCheckText(str, maxDelay, costs)
	}
	return checkRequest(&s.cr, s.rdescs, maxDelay, costs)
}

// decodeCheckText is decodeCheck of a whole body, which it first refuses when
// encoding/json would read it otherwise than it was written: text that is not valid
// UTF-8, or escapes a lone UTF-16 surrogate, which encoding/json turns into U+FFFD (so
// that "u1\xff" and "u1\xfe" would share one counter), a member given twice, of which
// it keeps the last, and a null where the schema wants a value, which it reads as the
// field's absence. The fast decoder takes none of
// these, so only this path checks them.
func decodeCheckText(body string, maxDelay *time.Duration, costs *[]int64) (enforcer.Request, error) {
	if err := checkText(body); err != nil {
		return enforcer.Request{}, err
	}
	if err := checkNoDuplicates(body); err != nil {
		return enforcer.Request{}, err
	}
	if err := checkNoNull(body); err != nil {
		return enforcer.Request{}, err
	}
	return decodeCheck(strings.NewReader(body), maxDelay, costs)
}

// errReader returns its error on every read.
type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }

// decodeCheck decodes and validates a check request; it sets *maxDelay from max_delay_ms
// and *costs as checkRequest does.
func decodeCheck(body io.Reader, maxDelay *time.Duration, costs *[]int64) (enforcer.Request, error) {
	var wr wireRequest
	d := json.NewDecoder(body)
	d.DisallowUnknownFields()
	if err := d.Decode(&wr); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return enforcer.Request{}, err
		}
		return enforcer.Request{}, fmt.Errorf("malformed JSON: %w", err)
	}
	if _, err := d.Token(); err != io.EOF {
		return enforcer.Request{}, &checkError{"malformed JSON: data after the request object"}
	}
	cr, err := wr.request()
	if err != nil {
		return enforcer.Request{}, err
	}
	descs := make([][]rules.Entry, len(cr.Descriptors))
	for i, cd := range cr.Descriptors {
		descs[i] = make([]rules.Entry, len(cd.Entries))
		for j, e := range cd.Entries {
			descs[i][j] = rules.Entry{Key: e.Key, Value: e.Value}
		}
	}
	return checkRequest(&cr, descs, maxDelay, costs)
}

// checkRequest validates a decoded check request whose descriptors' entries are descs,
// and returns it as an enforcer.Request; it sets *maxDelay from max_delay_ms, and *costs
// to each descriptor's cost when a descriptor's own hits_addend differs from the
// request's (else to empty).
func checkRequest(cr *CheckRequest, descs [][]rules.Entry, maxDelay *time.Duration, costs *[]int64) (enforcer.Request, error) {
	*costs = (*costs)[:0]
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
		if cd.HitsAddend == nil && cd.HitsAddendCamel == nil {
			continue
		}
		f := "descriptors[" + strconv.Itoa(i) + "]"
		dh, err := pickHits(f+".hits_addend", cd.HitsAddend, cd.HitsAddendCamel, nil)
		if err != nil {
			return req, err
		}
		if max(dh, 1) != max(hits, 1) && len(*costs) == 0 {
			// Each descriptor's cost, as the gRPC service takes them.
			for range cr.Descriptors {
				*costs = append(*costs, max(hits, 1))
			}
		}
		if len(*costs) > 0 {
			(*costs)[i] = max(dh, 1)
		}
	}
	req.Descriptors = descs
	if err := rules.ValidateRequest(req.Domain, req.Descriptors); err != nil {
		return req, err
	}
	return req, nil
}

// pickHits returns the one cost given among the spellings; a request may use one of
// them (as protobuf's JSON reader, behind /json, refuses a field given under both its
// names).
func pickHits(field string, vs ...*int64) (int64, error) {
	var got *int64
	for _, v := range vs {
		if v == nil {
			continue
		}
		if *v < 0 || *v > MaxHits {
			return 0, &checkError{fmt.Sprintf("%s: %d is not in 0..%d", field, *v, int64(MaxHits))}
		}
		if got != nil {
			return 0, &checkError{field + ": the cost is given under more than one name (hits_addend, hitsAddend, hits): give one"}
		}
		got = v
	}
	if got == nil {
		return 0, nil
	}
	return *got, nil
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

// wireRequest is CheckRequest as encoding/json reads it, with its integers as written, so
// that an integer written with a fraction of zero or an exponent (622.0, 6.22e2), which
// JSON Schema's "integer" includes, is taken as the integer it is.
type wireRequest struct {
	Domain          string           `json:"domain"`
	Descriptors     []wireDescriptor `json:"descriptors"`
	HitsAddend      *json.Number     `json:"hits_addend,omitempty"`
	HitsAddendCamel *json.Number     `json:"hitsAddend,omitempty"`
	Hits            *json.Number     `json:"hits,omitempty"`
	MaxDelayMs      *json.Number     `json:"max_delay_ms,omitempty"`
}

type wireDescriptor struct {
	Entries         []CheckEntry    `json:"entries"`
	HitsAddend      *json.Number    `json:"hits_addend,omitempty"`
	HitsAddendCamel *json.Number    `json:"hitsAddend,omitempty"`
	Limit           json.RawMessage `json:"limit,omitempty"`
}

// request converts wr, refusing a number that is not an integer of int64's range.
func (wr *wireRequest) request() (CheckRequest, error) {
	cr := CheckRequest{Domain: wr.Domain, Descriptors: make([]CheckDescriptor, len(wr.Descriptors))}
	var err error
	num := func(field string, n *json.Number) *int64 {
		if n == nil || err != nil {
			return nil
		}
		v, e := integer(*n)
		if e != nil {
			err = &checkError{"malformed JSON: " + field + ": " + n.String() + " is not an integer"}
			return nil
		}
		return &v
	}
	cr.HitsAddend = num("hits_addend", wr.HitsAddend)
	cr.HitsAddendCamel = num("hitsAddend", wr.HitsAddendCamel)
	cr.Hits = num("hits", wr.Hits)
	cr.MaxDelayMs = num("max_delay_ms", wr.MaxDelayMs)
	for i := range wr.Descriptors {
		wd, cd := &wr.Descriptors[i], &cr.Descriptors[i]
		f := "descriptors[" + strconv.Itoa(i) + "]."
		cd.Entries, cd.Limit = wd.Entries, wd.Limit
		cd.HitsAddend = num(f+"hits_addend", wd.HitsAddend)
		cd.HitsAddendCamel = num(f+"hitsAddend", wd.HitsAddendCamel)
	}
	if wr.Descriptors == nil {
		cr.Descriptors = nil
	}
	return cr, err
}

// integer reads n as an int64: digits, or a number with a zero fraction or an exponent
// whose value is a whole number within int64's range.
func integer(n json.Number) (int64, error) {
	if v, err := n.Int64(); err == nil {
		return v, nil
	}
	f, err := n.Float64()
	if err != nil || f != math.Trunc(f) || f < math.MinInt64 || f >= math.MaxInt64 {
		return 0, errors.New("not an integer")
	}
	return int64(f), nil
}
