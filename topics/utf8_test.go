package topics

import (
	"errors"
	"testing"
)

// TestJSONInvalidUTF8Rejected: encoding/json would decode a key with bytes that are not
// UTF-8, or with a lone surrogate escape, as U+FFFD, so that different keys share one
// counter; JSON hits, counts and heartbeats with such text are rejected as bad_utf8
// instead, and correct escapes (pairs, escaped backslashes) still decode.
func TestJSONInvalidUTF8Rejected(t *testing.T) {
	for _, b := range []string{
		"{\"key\":\"k\xff\",\"site\":\"s\",\"ts\":1}",
		`{"key":"k\ud800","site":"s","ts":1}`,
		`{"key":"k\udc00x","site":"s","ts":1}`,
		`{"key":"k\ud800\u0041","site":"s","ts":1}`,
		`{"key":"k","site":"s\uDBFF","ts":1}`,
		`{"key":"k\ud800`, // cut right after the high surrogate
	} {
		if _, err := DecodeHit([]byte(b)); !errors.Is(err, ErrBadUTF8) || Reason(err) != "bad_utf8" {
			t.Errorf("DecodeHit(%q): %v, want bad_utf8", b, err)
		}
	}
	if _, err := DecodeCount([]byte(`{"key":"k\udfff","w":1000,"asof":1,"total":1}`)); Reason(err) != "bad_utf8" {
		t.Errorf("DecodeCount with a lone surrogate: %v", err)
	}
	if _, err := DecodeHeartbeat([]byte("{\"topic\":\"hits\",\"sites\":{\"s\xc3\":1}}")); Reason(err) != "bad_utf8" {
		t.Errorf("DecodeHeartbeat with a site not in UTF-8: %v", err)
	}
	for b, key := range map[string]string{
		`{"key":"k\ud83d\ude00","site":"s","ts":1}`: "k\U0001F600",
		`{"key":"k\\ud800","site":"s","ts":1}`:      `k\ud800`,
		`{"key":"k\u00e9\"","site":"s","ts":1}`:     "k\u00e9\"",
		`{"key":"k\uFFFD","site":"s","ts":1}`:       "k\uFFFD",
	} {
		h, err := DecodeHit([]byte(b))
		if err != nil || h.Key != key {
			t.Errorf("DecodeHit(%s) = %q, %v; want key %q", b, h.Key, err, key)
		}
	}
}
