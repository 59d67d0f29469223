package rules

import (
	"strings"
)

// LimitOfKey returns the rule and the limit whose counter key key is (Rule.AppendKey), or
// the pool's limit for a pool's key (Pool.Key, with a nil Rule), as the Config would decide
// a request that makes it; ok is false when no limit of the Config makes such a key: an
// override's key (its limit is the request's), a key shortened for its length (its
// descriptor is not all there), a domain or descriptor the Config does not have, or a
// window no limit of the matched rule has. It is for showing counts next to their limits
// (the console, tools); it allocates.
func (c *Config) LimitOfKey(key string) (r *Rule, l *Limit, ok bool) {
	if c == nil || strings.HasSuffix(key, overrideMark) || strings.Contains(key, longKeyMark) {
		return nil, nil, false
	}
	if base, isPool := strings.CutSuffix(key, poolMark); isPool {
		domain, _, _ := strings.Cut(base, "|")
		for _, pl := range c.Pools(unescape(domain)) {
			if pl.Key == key {
				return nil, &pl.Limit, true
			}
		}
		return nil, nil, false
	}
	hash := strings.LastIndexByte(key, '#')
	if hash < 0 {
		return nil, nil, false
	}
	desc, tag := key[:hash], key[hash+1:]
	parts := strings.Split(desc, "|")
	if len(parts) < 2 {
		return nil, nil, false
	}
	entries := make([]Entry, 0, len(parts)-1)
	for _, p := range parts[1:] {
		k, v, found := strings.Cut(p, "=")
		if !found {
			return nil, nil, false
		}
		entries = append(entries, Entry{Key: unescape(k), Value: unescape(v)})
	}
	r = c.Match(unescape(parts[0]), entries)
	if r == nil {
		return nil, nil, false
	}
	for i := range r.Limits {
		if r.Limits[i].tag == tag {
			return r, &r.Limits[i], true
		}
	}
	return nil, nil, false
}

// unescape undoes appendEscaped: %XX to the byte it stands for. A '%' not followed by two
// hex digits is kept as it is.
func unescape(s string) string {
	if !strings.Contains(s, "%") {
		return s
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) {
			if h, l := unhex(s[i+1]), unhex(s[i+2]); h >= 0 && l >= 0 {
				b = append(b, byte(h<<4|l))
				i += 2
				continue
			}
		}
		b = append(b, s[i])
	}
	return string(b)
}

func unhex(c byte) int {
	switch {
	case '0' <= c && c <= '9':
		return int(c - '0')
	case 'A' <= c && c <= 'F':
		return int(c-'A') + 10
	case 'a' <= c && c <= 'f':
		return int(c-'a') + 10
	}
	return -1
}
