package httplimit

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http/httptest"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/streamlimit/streamlimit/enforcer"
	"github.com/streamlimit/streamlimit/enforcer/rules"
	"github.com/streamlimit/streamlimit/serve/headers"
)

// TestAppendCheckResponseMatchesEncodingJSON checks the hand-written encoder against
// encoding/json's encoding of the CheckResponse structs, byte for byte, over results of
// every shape the check API answers.
func TestAppendCheckResponseMatchesEncodingJSON(t *testing.T) {
	user := &rules.Rule{ID: "api.user"}
	minute := &rules.Limit{Requests: 2, Window: time.Minute, Unit: "minute"}
	odd := &rules.Rule{ID: `api.we"ird\<&>é` + "\x01\u2028\xff"}
	oddLimit := &rules.Limit{Name: `n"a\m<e>&ü` + "\t\x7f\xfe", Requests: 5, Window: 1500 * time.Millisecond, Unit: "Fortnight"}
	tiny := &rules.Limit{Requests: 1, Window: time.Nanosecond}
	huge := &rules.Limit{Requests: math.MaxInt64, Window: math.MaxInt64}
	cases := []struct {
		name   string
		res    enforcer.Result
		waited int64
	}{
		{"empty", enforcer.Result{}, 0},
		{"admitted", enforcer.Result{Statuses: []enforcer.Status{
			{Rule: user, Limit: minute, Requests: 2, Window: time.Minute, Remaining: 1, ResetAfter: time.Minute},
		}}, 0},
		{"denied", enforcer.Result{Code: enforcer.CodeOverLimit, Statuses: []enforcer.Status{
			{Code: enforcer.CodeOverLimit, Rule: user, Limit: minute, Requests: 2, Window: time.Minute, Remaining: -3, ResetAfter: 59*time.Second + 1, RetryAfter: 30 * time.Second},
		}}, 0},
		{"several descriptors, one unmatched, one unlimited, waited", enforcer.Result{Statuses: []enforcer.Status{
			{Rule: user, Limit: minute, Requests: 2, Window: time.Minute, Remaining: 1, ResetAfter: time.Minute},
			{},
			{Rule: &rules.Rule{ID: "api.free", Unlimited: true}},
			{Rule: &rules.Rule{ID: "api.ip"}, Limit: tiny, Requests: 1, Window: time.Nanosecond, Fallback: true},
		}}, 1234},
		{"shadow", enforcer.Result{Statuses: []enforcer.Status{
			{Rule: &rules.Rule{ID: "api.trial", ShadowMode: true}, Limit: minute, Requests: 1, Window: time.Minute, Shadow: true, RetryAfter: time.Second},
		}}, 0},
		{"huge numbers", enforcer.Result{Code: enforcer.CodeOverLimit, Statuses: []enforcer.Status{
			{Code: enforcer.CodeOverLimit, Rule: user, Limit: huge, Requests: math.MaxInt64, Window: math.MaxInt64, Remaining: math.MaxInt64, ResetAfter: math.MaxInt64, RetryAfter: math.MaxInt64},
		}}, math.MaxInt64},
		{"strings needing escapes", enforcer.Result{Code: enforcer.CodeOverLimit, Statuses: []enforcer.Status{
			{Code: enforcer.CodeOverLimit, Rule: odd, Limit: oddLimit, Requests: 5, Window: 1500 * time.Millisecond, RetryAfter: time.Second},
			{Rule: odd, Limit: &rules.Limit{Requests: 3, Window: time.Hour, Unit: "hour"}, Requests: 3, Window: time.Hour, Remaining: 2},
		}}, 0},
		{"no rule ID", enforcer.Result{Statuses: []enforcer.Status{
			{Rule: &rules.Rule{}, Limit: minute, Requests: 2, Window: time.Minute},
		}}, 0},
	}
	// Results of the limiter itself, whose limits come parsed from rules: the second
	// request of a soft_percent rule is admitted in its soft band.
	l, _ := newLimiter(t)
	for i, key := range []string{"metered", "metered", "metered", "user", "trial", "bench"} {
		var res enforcer.Result
		l.DecideInto(t.Context(), enforcer.Request{Domain: "api", Descriptors: [][]rules.Entry{{{Key: key, Value: "v"}}, {{Key: "nothing", Value: "x"}}}, Hits: 1}, &res)
		cases = append(cases, struct {
			name   string
			res    enforcer.Result
			waited int64
		}{"limiter " + key + " " + string(rune('0'+i)), res, 0})
	}
	var vals headers.Values
	var buf []byte
	softSeen := false
	for _, c := range cases {
		for i := range c.res.Statuses {
			softSeen = softSeen || c.res.Statuses[i].Soft()
		}
		resp := checkResponseRef(&c.res)
		resp.WaitedMs = c.waited
		want, err := json.Marshal(resp)
		if err != nil {
			t.Fatal(err)
		}
		vals.Render(&c.res)
		buf = appendCheckResponse(buf[:0], &c.res, &vals, c.waited)
		if string(buf) != string(want) {
			t.Errorf("%s:\n got %s\nwant %s", c.name, buf, want)
		}
	}
	if !softSeen {
		t.Error("no case has a soft status")
	}
}

// TestCheckDecodeMatchesEncodingJSON checks the check handler's decoding (the fast
// decoder, falling back to encoding/json) against encoding/json alone: the same request or
// the same error for every body, plain or not, with one checkState reused throughout as
// the handler's pool reuses it.
func TestCheckDecodeMatchesEncodingJSON(t *testing.T) {
	const d = `"descriptors":[{"entries":[{"key":"user","value":"42"}]}]`
	plain := []string{
		benchCheckBody,
		`{"domain":"api",` + d + `}`,
		" {\n\t\"domain\" : \"api\" ,\r\n \"descriptors\" : [ { \"entries\" : [ { \"key\" : \"user\" , \"value\" : \"42\" } ] } ] } \n",
		`{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"42"},{"key":"path","value":"/a/b"}]},{"entries":[{"key":"ip","value":"192.0.2.1"}],"hits_addend":3}],"hits":3}`,
		`{"domain":"api",` + d + `,"hitsAddend":2,"hits_addend":2,"max_delay_ms":1500}`,
		`{"domain":"api","descriptors":[{"hitsAddend":0,"entries":[{"value":"é日本","key":"ü"}]}],"hits_addend":0}`,
		`{"domain":"api",` + d + `,"max_delay_ms":-0}`,
		`{}`,
		`{"domain":"api","descriptors":[]}`,
		`{"domain":"api","descriptors":[{"entries":[]}]}`,
		`{"domain":"api","descriptors":[{"entries":[{}]}]}`,
		`{"domain":"api",` + d + `,"hits_addend":-1}`,
		`{"domain":"api",` + d + `,"hits_addend":99999999999}`,
		`{"domain":"api",` + d + `,"hits":1,"hits_addend":2}`,
		`{"domain":"api","descriptors":[{"entries":[{"key":"u","value":"1"}],"hits_addend":2}],"hits_addend":1}`,
		`{"domain":"api",` + d + `,"max_delay_ms":60001}`,
		`{"domain":"",` + d + `}`,
	}
	others := []string{
		`{"domain":"api","domain":"other",` + d + `,"hits":1,"hits":2}`,
		`{"domain":"api","descriptors":[{"entries":[{"key":"a","key":"b","value":"1","value":"2"}]}]}`,
		``,
		`   `,
		`[]`,
		`null`,
		`{"domain":`,
		`{"domain":"api",` + d + `} {}`,
		`{"domain":"api",` + d + `}x`,
		`{"domain":"api",` + d + `,"extra":1}`,
		`{"Domain":"api",` + d + `}`,
		`{"domain":null,` + d + `}`,
		`{"domain":"api","descriptors":null}`,
		`{"domain":"api","descriptors":[{"entries":null}]}`,
		`{"domain":"api","descriptors":[{}]}`,
		`{"domain":"api","descriptors":{}}`,
		`{"domain":"a\"p\\i\u00e9",` + d + `}`,
		`{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"4\n2"}]}]}`,
		"{\"domain\":\"api\",\"descriptors\":[{\"entries\":[{\"key\":\"user\",\"value\":\"4\xff2\"}]}]}",
		`{"domain":"api","descriptors":[{"entries":[{"key":"a","value":"1"}],"entries":[{"key":"b","value":"2"}]}]}`,
		`{"domain":"api",` + d + `,` + d + `}`,
		"{\"domain\":\"api\xff\"," + d + `}`,
		"{\"domain\":\"a\x01pi\"," + d + `}`,
		`{"domain":"api",` + d + `,"hits_addend":1.5}`,
		`{"domain":"api",` + d + `,"hits_addend":1e2}`,
		`{"domain":"api",` + d + `,"hits_addend":01}`,
		`{"domain":"api",` + d + `,"hits_addend":"1"}`,
		`{"domain":"api",` + d + `,"hits_addend":9223372036854775807}`,
		`{"domain":"api",` + d + `,"hits_addend":9223372036854775808}`,
		`{"domain":"api",` + d + `,"hits_addend":-}`,
		`{"domain":"api","descriptors":[{"entries":[{"key":"u","value":"1","extra":2}]}]}`,
		`{"domain":"api","descriptors":[{"entries":[{"key":"u","value":"1"}],"limit":{"requests_per_unit":5,"unit":"SECOND"}}]}`,
		`{"domain":"api","descriptors":[{"entries":[{"key":"u","value":"1"}],"hits_addend":1,"hits_addend":1}]}`,
		`{"domain":"api","descriptors":[{"entries":[{"key":"u","value":"1"},]}]}`,
		`{"domain":"api","descriptors":[{"entries":[{"key":"u","value":"1"}]},]}`,
		`{"domain":"api",}`,
		`{"domain":"api","descriptors":[` + strings.Repeat(`{"entries":[{"key":"u","value":"1"}],"hits_addend":1},`, 20) + `{"entries":[{"key":"u","value":"1"}]}],"hits":1}`,
		`{"domain":"api"`,
		`{"domain":"api",` + d,
	}
	s := new(checkState)
	for round := range 2 {
		for i, body := range append(append([]string(nil), plain...), others...) {
			if i < len(plain) && !s.fastDecode([]byte(body), body) {
				t.Errorf("%q: not taken by the fast decoder", body)
			}
			if err := compareDecode(s, body); err != "" {
				t.Errorf("round %d, %q: %s", round, body, err)
			}
		}
	}
}

// compareDecode decodes body with s.decode and with decodeCheck alone and says how the
// two differ, "" when they agree.
func compareDecode(s *checkState, body string) string {
	var wantDelay, gotDelay time.Duration
	var wantCosts, gotCosts []int64
	want, wantErr := decodeCheckText(body, &wantDelay, &wantCosts)
	got, gotErr := s.decode(strings.NewReader(body), &gotDelay, &gotCosts)
	if (wantErr == nil) != (gotErr == nil) || wantErr != nil && gotErr.Error() != wantErr.Error() {
		return fmt.Sprintf("error %v, want %v", gotErr, wantErr)
	}
	if wantErr != nil {
		var ce *checkError
		if errors.As(wantErr, &ce) != errors.As(gotErr, &ce) {
			return fmt.Sprintf("error type %T, want %T", gotErr, wantErr)
		}
		return ""
	}
	if !slices.Equal(gotCosts, wantCosts) {
		return fmt.Sprintf("costs %v, want %v", gotCosts, wantCosts)
	}
	if got.Domain != want.Domain || got.Hits != want.Hits || gotDelay != wantDelay || !reflect.DeepEqual(got.Descriptors, want.Descriptors) {
		return fmt.Sprintf("%+v delay %v, want %+v delay %v", got, gotDelay, want, wantDelay)
	}
	return ""
}

// FuzzCheckDecode looks for a body that the check handler decodes otherwise than
// encoding/json: `go test -fuzz FuzzCheckDecode ./serve/httplimit`.
func FuzzCheckDecode(f *testing.F) {
	f.Add(benchCheckBody)
	f.Add(`{"domain":"api","descriptors":[{"entries":[{"key":"a","value":"é"},{"key":"b","value":"2"}],"hits_addend":2},{"entries":[]}],"hits":2,"max_delay_ms":10}`)
	f.Add(`{"domain":"a\"pi","descriptors":[{"entries":[{"key":"u","value":"1"}]}]} {}`)
	s := new(checkState)
	f.Fuzz(func(t *testing.T, body string) {
		if err := compareDecode(s, body); err != "" {
			t.Errorf("%q: %s", body, err)
		}
	})
}

// TestCheckHandlerConcurrent checks that concurrent requests, whose working memory comes
// from one pool, each get their own answer: every caller's descriptor names a different
// rule, which its answer must name.
func TestCheckHandlerConcurrent(t *testing.T) {
	l, _ := newLimiter(t)
	h := NewCheckHandler(l, CheckOptions{})
	keys := []string{"user", "api_key", "remote_address", "route"}
	var wg sync.WaitGroup
	for g, key := range keys {
		wg.Go(func() {
			for i := range 200 {
				body := `{"domain":"api","descriptors":[{"entries":[{"key":"` + key + `","value":"` + strconv.Itoa(g*1000+i) + `"}]}]}`
				w := httptest.NewRecorder()
				h.ServeHTTP(w, httptest.NewRequest("POST", "/v1/check", strings.NewReader(body)))
				var cr CheckResponse
				if err := json.Unmarshal(w.Body.Bytes(), &cr); err != nil || w.Code != 200 || len(cr.Statuses) != 1 || cr.Statuses[0].Rule != "api."+key ||
					w.Header().Get("Content-Length") != strconv.Itoa(w.Body.Len()) {
					t.Errorf("%s: %d %v %s (Content-Length %s)", key, w.Code, err, w.Body.Bytes(), w.Header().Get("Content-Length"))
					return
				}
			}
		})
	}
	wg.Wait()
}

// checkResponseRef is the check answer as CheckResponse structs, which encoding/json
// encodes for TestAppendCheckResponseMatchesEncodingJSON: the reference the
// hand-written encoder must match.
func checkResponseRef(res *enforcer.Result) CheckResponse {
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

// TestJSONPlain checks jsonPlain against encoding/json for every byte.
func TestJSONPlain(t *testing.T) {
	for c := range 256 {
		b := string([]byte{byte(c)})
		q, _ := json.Marshal(b)
		want := c < utf8.RuneSelf && string(q) == `"`+b+`"`
		if got := jsonPlain(byte(c)); got != want {
			t.Errorf("jsonPlain(%#x) = %v, want %v (encoding/json writes %s)", c, got, want, q)
		}
	}
}
