package httplimit

import (
	"encoding/json"
	"net/http/httptest"
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
