package server

import "testing"

// TestBearerSchemeCaseInsensitive: the Authorization scheme's name is case-insensitive
// (RFC 9110 §11.1), so "bearer <token>" is accepted as "Bearer <token>" is (before: 401).
func TestBearerSchemeCaseInsensitive(t *testing.T) {
	tok, err := newTokens([]string{"s3cret"})
	if err != nil {
		t.Fatal(err)
	}
	for header, want := range map[string]bool{
		"Bearer s3cret":   true,
		"bearer s3cret":   true,
		"BEARER  s3cret":  true,
		"Bearer s3cret ":  true,
		"Bearers3cret":    false,
		"Basic s3cret":    false,
		"Bearer other":    false,
		"s3cret":          false,
		"Bearer":          false,
		" Bearer s3cret":  false,
		"Bearer\ts3cret":  false,
		"Bearer s3cretX":  false,
		"Bearer  s3cret2": false,
	} {
		if got := tok.ok(header); got != want {
			t.Errorf("%q: %v, want %v", header, got, want)
		}
	}
}
