package httplimit

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
)

// TestCheckRefusesTextThatWouldMerge sends /v1/check values that encoding/json would read
// as U+FFFD, so that distinct clients would share one counter (user 2 per minute): each
// is answered 400, as /json answers them, and none takes quota from "u\ufffd". Before,
// "u\xff", "u\xfe" and "u\ud800" were one counter: the third was denied.
func TestCheckRefusesTextThatWouldMerge(t *testing.T) {
	l, _ := newLimiter(t)
	srv := httptest.NewServer(NewCheckHandler(l, CheckOptions{}))
	defer srv.Close()
	body := func(v string) string {
		return `{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"` + v + `"}]}]}`
	}
	for _, c := range []struct{ value, detail string }{
		{"u\xff", "UTF-8"},
		{"u\xfe", "UTF-8"},
		{`u\ud800`, "lone high surrogate"},
		{`u\udfff`, "lone low surrogate"},
		{`u\ud800\u0041`, "lone high surrogate"},
		{"\xed\xa0\x80", "UTF-8"}, // a surrogate written as UTF-8
	} {
		resp, b := postJSON(t, srv.Client(), srv.URL, body(c.value))
		var p map[string]any
		_ = json.Unmarshal(b, &p)
		if resp.StatusCode != 400 || !strings.Contains(p["detail"].(string), c.detail) {
			t.Errorf("%q: %d %s, want 400 naming %q", c.value, resp.StatusCode, b, c.detail)
		}
	}
	// Valid text still decodes: an escaped pair, an escaped backslash before u, and the
	// replacement character itself, which has its own counter with the full limit.
	for _, v := range []string{`\ud83d\ude00`, `\\ud800`, "u\ufffd", "u\ufffd"} {
		if resp, b := postJSON(t, srv.Client(), srv.URL, body(v)); resp.StatusCode != 200 {
			t.Errorf("%q: %d %s", v, resp.StatusCode, b)
		}
	}
}

// TestCheckRefusesDuplicateFields: an object that gives a member twice is 400 naming the
// member, wherever it is (before: 200, the last value decided, so that a filter in front
// that read the first saw another request). Names that encoding/json takes for one field
// ("domain", "Domain") are one member.
func TestCheckRefusesDuplicateFields(t *testing.T) {
	l, _ := newLimiter(t)
	srv := httptest.NewServer(NewCheckHandler(l, CheckOptions{}))
	defer srv.Close()
	const d = `"descriptors":[{"entries":[{"key":"user","value":"dup"}]}]`
	for _, c := range []struct{ body, field string }{
		{`{"domain":"api","descriptors":[{"entries":[{"key":"user","key":"other","value":"dup"}]}]}`, "descriptors[0].entries[0].key"},
		{`{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"a","value":"b"}]}]}`, "descriptors[0].entries[0].value"},
		{`{"domain":"api","domain":"other",` + d + `}`, "domain"},
		{`{"domain":"api","Domain":"other",` + d + `}`, "Domain"},
		{`{"domain":"api",` + d + `,"hits_addend":1,"hits_addend":100}`, "hits_addend"},
		{`{"domain":"api",` + d + `,"max_delay_ms":0,"max_delay_ms":10}`, "max_delay_ms"},
		{`{"domain":"api",` + d + `,` + d + `}`, "descriptors"},
		{`{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"dup"}],"hits_addend":1,"hits_addend":2}]}`, "descriptors[0].hits_addend"},
		{`{"domain":"api","descriptors":[{"entries":[],"entries":[{"key":"user","value":"dup"}]}]}`, "descriptors[0].entries"},
		{`{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"dup"}],"limit":{"unit":"SECOND","unit":"DAY"}}]}`, "descriptors[0].limit.unit"},
	} {
		resp, b := postJSON(t, srv.Client(), srv.URL, c.body)
		var p map[string]any
		_ = json.Unmarshal(b, &p)
		want := c.field + ": the field is given more than once"
		if detail, _ := p["detail"].(string); resp.StatusCode != 400 || !strings.Contains(detail, want) {
			t.Errorf("%s: %d %s, want 400 with %q", c.body, resp.StatusCode, b, want)
		}
	}
	// The same member in two objects is no duplicate.
	if resp, b := postJSON(t, srv.Client(), srv.URL, `{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"a"},{"key":"user","value":"b"}]}]}`); resp.StatusCode != 200 {
		t.Errorf("one key per entry: %d %s", resp.StatusCode, b)
	}
}

// TestCheckRefusesNullAndTwoSpellings: a null where the schema wants a value, and a cost
// given under two of its names, are 400 (before: 200, the null read as no cost, and two
// equal spellings taken).
func TestCheckRefusesNullAndTwoSpellings(t *testing.T) {
	l, _ := newLimiter(t)
	srv := httptest.NewServer(NewCheckHandler(l, CheckOptions{}))
	defer srv.Close()
	const d = `"descriptors":[{"entries":[{"key":"user","value":"n"}]}]`
	for _, c := range []struct{ body, detail string }{
		{`{"domain":"api",` + d + `,"hits_addend":null}`, "hits_addend: null"},
		{`{"domain":"api",` + d + `,"max_delay_ms":null}`, "max_delay_ms: null"},
		{`{"domain":null,` + d + `}`, "domain: null"},
		{`{"domain":"api","descriptors":[{"entries":[{"key":"user","value":null}]}]}`, "descriptors[0].entries[0].value: null"},
		{`{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"n"}],"hits_addend":null}]}`, "descriptors[0].hits_addend: null"},
		{`null`, "the request: null"},
		{`{"domain":"api",` + d + `,"hits_addend":1,"hitsAddend":1}`, "more than one name"},
		{`{"domain":"api",` + d + `,"hits":2,"hitsAddend":2}`, "more than one name"},
		{`{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"n"}],"hits_addend":1,"hitsAddend":1}]}`, "more than one name"},
	} {
		resp, b := postJSON(t, srv.Client(), srv.URL, c.body)
		var p map[string]any
		_ = json.Unmarshal(b, &p)
		if resp.StatusCode != 400 || !strings.Contains(p["detail"].(string), c.detail) {
			t.Errorf("%s: %d %s, want 400 naming %q", c.body, resp.StatusCode, b, c.detail)
		}
	}
	// A descriptor's limit, which the check API ignores, may hold anything.
	if resp, b := postJSON(t, srv.Client(), srv.URL, `{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"m"}],"limit":{"unit":null}}]}`); resp.StatusCode != 200 {
		t.Errorf("null inside limit: %d %s", resp.StatusCode, b)
	}
}

// TestForwardedSmuggling sends, through a trusted proxy (127.0.0.1) that appends
// `for=198.51.100.7` (the real client) to the Forwarded header, 6 requests each naming a
// new address in the part the client wrote, against remote_address 2 per minute with
// forwarded_header: Forwarded. Each attempt must get 2 through, the real client's limit.
// Before, a quote the client left open swallowed the proxy's element on the same line
// (6 of 6 through for the first three).
func TestForwardedSmuggling(t *testing.T) {
	const proxy = `for=198.51.100.7`
	sameLine := map[string]string{
		"open quote in a parameter":     `for=203.0.113.%[1]d;x="`,
		"open quote in for":             `for="203.0.113.%[1]d`,
		"escaped closing quote":         `for=203.0.113.%[1]d;x="\"`,
		"element inside a quoted value": `for=192.0.2.1;x="y, for=203.0.113.%[1]d"`,
		"for given twice":               `for=203.0.113.%[1]d;for=192.0.2.%[1]d`,
		"case and white space":          `FOR=203.0.113.%[1]d , For=192.0.2.%[1]d ;`,
		"backslash before the proxy":    `for=203.0.113.%[1]d;x="\\`,
	}
	for name, client := range sameLine {
		t.Run(name, func(t *testing.T) {
			srv := forwardedServer(t)
			n := admitted(t, srv.Client(), srv.URL, 6, func(i int) map[string]string {
				return map[string]string{"Forwarded": fmt.Sprintf(client, i) + ", " + proxy}
			})
			if n != 2 {
				t.Fatalf("admitted %d of 6, want 2 (the limit)", n)
			}
		})
	}
	// On the wire: header lines as the proxy passes them on, its own last.
	wire := map[string]string{
		"duplicate lines with open quotes": "Forwarded: for=203.0.113.%[1]d;x=\"\r\nForwarded: for=192.0.2.%[1]d;y=\"\r\nForwarded: " + proxy + "\r\n",
		"the client's line folded":         "Forwarded: for=203.0.113.%[1]d;x=\"a\r\n b, for=192.0.2.%[1]d\r\nForwarded: " + proxy + "\r\n",
		"Forwarded folded into another":    "X-A: a\r\n Forwarded: for=203.0.113.%[1]d\r\nForwarded: " + proxy + "\r\n",
		"an IPv6 proxy element":            "Forwarded: for=203.0.113.%[1]d;x=\"\r\nForwarded: for=\"[2001:db8::7]:4711\"\r\n",
	}
	for name, lines := range wire {
		t.Run(name, func(t *testing.T) {
			srv := forwardedServer(t)
			n := 0
			for i := range 6 {
				if rawStatus(t, srv.Listener.Addr().String(), fmt.Sprintf(lines, i)) != http.StatusTooManyRequests {
					n++
				}
			}
			if n != 2 {
				t.Fatalf("admitted %d of 6, want 2 (the limit)", n)
			}
		})
	}
}

func forwardedServer(t *testing.T) *httptest.Server {
	m := newMW(t, Config{Descriptors: one(Source{Type: SourceRemoteAddress}), TrustedProxies: []string{"127.0.0.1"}, ForwardedHeader: "Forwarded"}, nil)
	srv := httptest.NewServer(m.Handler(okHandler))
	t.Cleanup(srv.Close)
	return srv
}

// rawStatus sends a GET with the header lines hdr (each ending in CRLF) as they are, and
// returns the status.
func rawStatus(t *testing.T, addr, hdr string) int {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n"+hdr+"Connection: close\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestAuthTrustsOnlyItsHeader: /v1/auth reads the client's address from X-Real-IP (its
// ClientIPHeader) and no other header. From trusted nginx, a request whose X-Real-IP is
// missing or "unix:" (a client on a Unix socket) while the client's own X-Forwarded-For
// rotates is counted under nginx's address: 2 of 6 admitted against 2 per minute (before:
// 6 of 6, the client's X-Forwarded-For believed).
func TestAuthTrustsOnlyItsHeader(t *testing.T) {
	for name, realIP := range map[string]string{"missing": "", "unix:": "unix:", "garbage": "not an address"} {
		t.Run(name, func(t *testing.T) {
			m := newMW(t, Config{Descriptors: one(Source{Type: SourceRemoteAddress}), TrustedProxies: []string{"127.0.0.1"}}, nil)
			srv := httptest.NewServer(m.AuthHandler(AuthOptions{}))
			defer srv.Close()
			n := admitted(t, srv.Client(), srv.URL+"/v1/auth", 6, func(i int) map[string]string {
				h := map[string]string{"X-Forwarded-For": fmt.Sprintf("203.0.113.%d", i), "Forwarded": fmt.Sprintf("for=192.0.2.%d", i)}
				if realIP != "" {
					h["X-Real-IP"] = realIP
				}
				return h
			})
			if n != 2 {
				t.Fatalf("admitted %d of 6, want 2 (nginx's own limit)", n)
			}
		})
	}
	t.Run("a list in the configured header", func(t *testing.T) {
		m := newMW(t, Config{Descriptors: one(Source{Type: SourceRemoteAddress}), TrustedProxies: []string{"127.0.0.1", "10.0.0.0/8"}}, nil)
		srv := httptest.NewServer(m.AuthHandler(AuthOptions{ClientIPHeader: "X-Forwarded-For"}))
		defer srv.Close()
		// nginx's $proxy_add_x_forwarded_for: the client's part, then what nginx saw.
		n := admitted(t, srv.Client(), srv.URL+"/v1/auth", 6, func(i int) map[string]string {
			return map[string]string{"X-Forwarded-For": fmt.Sprintf("203.0.113.%d, 198.51.100.7, 10.0.0.2", i), "X-Real-IP": fmt.Sprintf("192.0.2.%d", i)}
		})
		if n != 2 {
			t.Fatalf("admitted %d of 6, want 2", n)
		}
	})
}

// TestAuthMethodsAndStatus: /v1/auth answers GET, HEAD and POST; another method is 405
// with Allow (before: TRACE was decided, 204), and a ?status other than 401, 403 or 429 is
// 400 (before: ignored, 204).
func TestAuthMethodsAndStatus(t *testing.T) {
	m := newMW(t, Config{Descriptors: one(Source{Type: SourceRemoteAddress})}, nil)
	srv := httptest.NewServer(m.AuthHandler(AuthOptions{}))
	defer srv.Close()
	for _, method := range []string{"TRACE", "PUT", "DELETE", "PATCH", "OPTIONS"} {
		resp := do(t, srv.Client(), method, srv.URL+"/v1/auth", nil, "")
		if resp.StatusCode != 405 || resp.Header.Get("Allow") != "GET, HEAD, POST" {
			t.Errorf("%s: %d, Allow %q", method, resp.StatusCode, resp.Header.Get("Allow"))
		}
	}
	for _, q := range []string{"-58800", "200", "x", "401&status=403"} {
		if resp := do(t, srv.Client(), "GET", srv.URL+"/v1/auth?status="+q, nil, ""); resp.StatusCode != 400 {
			t.Errorf("?status=%s: %d", q, resp.StatusCode)
		}
	}
	for _, method := range []string{"GET", "HEAD"} {
		if resp := do(t, srv.Client(), method, srv.URL+"/v1/auth?status=403", nil, ""); resp.StatusCode != 204 {
			t.Errorf("%s: %d", method, resp.StatusCode)
		}
	}
	if resp := do(t, srv.Client(), "POST", srv.URL+"/v1/auth?status=403", nil, ""); resp.StatusCode != 403 {
		t.Errorf("third request, denied with ?status=403: %d", resp.StatusCode)
	}
}

// TestCheckPerDescriptorCost: a descriptor's own hits_addend that differs from the
// request's is decided as the gRPC service decides it, the descriptors of each cost
// together (before: 400, although the schema allows it). user: 2 per minute.
func TestCheckPerDescriptorCost(t *testing.T) {
	l, _ := newLimiter(t)
	srv := httptest.NewServer(NewCheckHandler(l, CheckOptions{}))
	defer srv.Close()
	post := func(body string) CheckResponse {
		t.Helper()
		resp, b := postJSON(t, srv.Client(), srv.URL, body)
		var r CheckResponse
		if err := json.Unmarshal(b, &r); err != nil || len(r.Statuses) != 2 {
			t.Fatalf("%s: %d %s", body, resp.StatusCode, b)
		}
		return r
	}
	r := post(`{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"b"}],"hits_addend":2},{"entries":[{"key":"user","value":"c"}]}]}`)
	if r.OverallCode != "OK" || r.Statuses[0].LimitRemaining != 0 || r.Statuses[1].LimitRemaining != 1 {
		t.Fatalf("costs 2 and 1: %+v", r)
	}
	// user=b is spent: its group is denied, and user=d, after it, is neither decided nor
	// charged.
	r = post(`{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"b"}],"hitsAddend":2},{"entries":[{"key":"user","value":"d"}]}],"hits":1}`)
	if r.OverallCode != "OVER_LIMIT" || r.Statuses[0].Code != "OVER_LIMIT" || r.Statuses[1].Code != "OK" || r.Statuses[1].CurrentLimit != nil {
		t.Fatalf("b spent: %+v", r)
	}
	r = post(`{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"d"}]},{"entries":[{"key":"user","value":"e"}],"hits_addend":2}]}`)
	if r.OverallCode != "OK" || r.Statuses[0].LimitRemaining != 1 || r.Statuses[1].LimitRemaining != 0 {
		t.Fatalf("user=d was charged by a denied request: %+v", r)
	}
}

// TestCheckIntegralNumbers: JSON Schema's integer includes 2.0 and 2e0, so the check API
// takes them as 2 (before: 400, "cannot unmarshal number 2.0"); 2.5 stays a 400.
func TestCheckIntegralNumbers(t *testing.T) {
	l, _ := newLimiter(t)
	srv := httptest.NewServer(NewCheckHandler(l, CheckOptions{}))
	defer srv.Close()
	for i, c := range []struct {
		hits   string
		status int
		left   int64
	}{{"2.0", 200, 0}, {"2e0", 200, 0}, {"1.00", 200, 1}, {"2.5", 400, 0}, {"1e400", 400, 0}} {
		resp, b := postJSON(t, srv.Client(), srv.URL, `{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"i`+strconv.Itoa(i)+`"}]}],"hits_addend":`+c.hits+`}`)
		var r CheckResponse
		_ = json.Unmarshal(b, &r)
		if resp.StatusCode != c.status || c.status == 200 && r.Statuses[0].LimitRemaining != c.left {
			t.Errorf("hits_addend %s: %d %s, want %d", c.hits, resp.StatusCode, b, c.status)
		}
	}
}
