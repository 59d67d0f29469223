package httplimit

import (
	"encoding/json"
	"errors"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// checkText refuses JSON text that is not valid UTF-8 or that escapes a lone UTF-16
// surrogate ("\ud800"): encoding/json would read either as U+FFFD, so that distinct
// values would become one ("u1\xff" and "u1\xfe" would share a counter).
func checkText(s string) error {
	if !utf8.ValidString(s) {
		return &checkError{"malformed JSON: the body is not valid UTF-8"}
	}
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' {
			continue
		}
		i++ // the escaped character: an escaped backslash is skipped whole
		if i >= len(s) || s[i] != 'u' {
			continue
		}
		r, ok := hex4(s, i+1)
		if !ok {
			continue // not an escape encoding/json accepts: it says why
		}
		i += 4
		switch {
		case !utf16.IsSurrogate(r):
		case r >= 0xdc00:
			return &checkError{`malformed JSON: lone low surrogate \u` + strconv.FormatInt(int64(r), 16)}
		default:
			if i+6 < len(s) && s[i+1] == '\\' && s[i+2] == 'u' {
				if lo, ok := hex4(s, i+3); ok && lo >= 0xdc00 && lo <= 0xdfff {
					i += 6
					continue
				}
			}
			return &checkError{`malformed JSON: lone high surrogate \u` + strconv.FormatInt(int64(r), 16)}
		}
	}
	return nil
}

// hex4 reads the four hex digits of a \u escape at s[i:].
func hex4(s string, i int) (rune, bool) {
	if i+4 > len(s) {
		return 0, false
	}
	n, err := strconv.ParseUint(s[i:i+4], 16, 32)
	return rune(n), err == nil
}

// checkNoNull refuses a null anywhere in a check request but inside a descriptor's limit
// (which the check API ignores): encoding/json reads a null as the field's absence, so
// that `"hits_addend":null` would be taken as a cost of 1 where the schema wants an
// integer. Text that is not well-formed JSON is left to decodeCheck, which says why.
func checkNoNull(s string) error {
	var v any
	d := json.NewDecoder(strings.NewReader(s))
	d.UseNumber()
	if d.Decode(&v) != nil {
		return nil
	}
	if field, ok := findNull(v, ""); ok {
		if field == "" {
			field = "the request"
		}
		return &checkError{field + ": null is not allowed; leave the field out"}
	}
	return nil
}

// findNull returns the path of the first null in v, in the form of
// rules.RequestError's fields, skipping members named "limit".
func findNull(v any, path string) (string, bool) {
	switch v := v.(type) {
	case nil:
		return path, true
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			if k == "limit" {
				continue
			}
			p := k
			if path != "" {
				p = path + "." + k
			}
			if f, ok := findNull(v[k], p); ok {
				return f, true
			}
		}
	case []any:
		for i, e := range v {
			if f, ok := findNull(e, path+"["+strconv.Itoa(i)+"]"); ok {
				return f, true
			}
		}
	}
	return "", false
}

// checkNoDuplicates refuses an object, anywhere in the body, that gives a member twice:
// encoding/json keeps the last value, so that a proxy or filter in front of the enforcer
// that reads the first ({"key":"a","key":"b"}) would see another request than the one
// decided. Names are compared as encoding/json matches them to fields, case-insensitively
// ("domain" and "Domain" are one field). Text that is not well-formed JSON is left to
// decodeCheck, which says why.
func checkNoDuplicates(s string) error {
	d := json.NewDecoder(strings.NewReader(s))
	d.UseNumber()
	err := walkDuplicates(d, "")
	if ce, ok := errors.AsType[*checkError](err); ok {
		return ce
	}
	return nil
}

// walkDuplicates reads one value from d, failing with a checkError at the first member
// given twice; path is the value's place in the form of rules.RequestError's fields.
func walkDuplicates(d *json.Decoder, path string) error {
	tok, err := d.Token()
	if err != nil {
		return err
	}
	switch tok {
	case json.Delim('{'):
		seen := make(map[string]bool)
		for d.More() {
			tok, err := d.Token()
			if err != nil {
				return err
			}
			key, _ := tok.(string)
			p := key
			if path != "" {
				p = path + "." + key
			}
			folded := foldName(key)
			if seen[folded] {
				return &checkError{"malformed JSON: " + p + ": the field is given more than once"}
			}
			seen[folded] = true
			if err := walkDuplicates(d, p); err != nil {
				return err
			}
		}
	case json.Delim('['):
		for i := 0; d.More(); i++ {
			if err := walkDuplicates(d, path+"["+strconv.Itoa(i)+"]"); err != nil {
				return err
			}
		}
	default:
		return nil
	}
	_, err = d.Token() // the closing delimiter
	return err
}

// foldName folds a member's name as encoding/json does to match it to a field: each
// rune becomes the smallest of its case-folding orbit ("K", "k" and the Kelvin sign are
// one).
func foldName(name string) string {
	var b strings.Builder
	b.Grow(len(name))
	for _, r := range name {
		for {
			next := unicode.SimpleFold(r)
			if next <= r {
				r = next
				break
			}
			r = next
		}
		b.WriteRune(r)
	}
	return b.String()
}
