package httplimit

import (
	"encoding/json"
	"slices"
	"strconv"
	"strings"
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
