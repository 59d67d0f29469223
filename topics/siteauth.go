package topics

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/streamlimit/streamlimit/clock"
)

// HeaderSiteMAC is the Kafka record header that proves a hits-topic record's site: the
// HMAC-SHA256 of the record's value under the site's key (SiteMAC), 32 bytes. The site is
// named inside the value (a hit's, a hit batch's, a site record's Site), so whoever may
// write the topic may write any site's name; with authentication on, the aggregator counts
// only records whose header matches the key of the site they name (SiteKeys.Verify).
// Readers without keys ignore the header, as Kafka lets them: the value's format is
// unchanged.
const HeaderSiteMAC = "streamlimit-site-mac"

// MinSiteKeyLen is the shortest site key accepted, in bytes: HMAC-SHA256's own strength.
const MinSiteKeyLen = 32

// siteMACContext is prepended to every value signed, so that a site key signs hits-topic
// records and nothing else, should it ever be used for another purpose.
const siteMACContext = "streamlimit site record v1\x00"

// MaxSiteRecordAhead is how far ahead of a reader's clock a site record (heartbeat or
// leave) may be dated: clock.MaxAhead, twice the skew from true time hosts are held to. A
// site dates its records by its own clock as it writes them, so with every clock within
// clock.MaxSkew of true time a genuine record is never further ahead; one dated further
// would make its site look heard from (a heartbeat) or gone (a leave) until then,
// overriding what the site itself says meanwhile. It is the bound enforcers hold counts
// to (snapshot.DefaultMaxCountAhead): the clocks of sites and aggregators must agree
// within it anyway for counts to be believed.
const MaxSiteRecordAhead = clock.MaxAhead

// SiteMAC returns the proof of value's site under key: HMAC-SHA256 of a fixed context
// string and value.
func SiteMAC(key, value []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(siteMACContext))
	m.Write(value)
	return m.Sum(nil)
}

// SiteKeys holds site keys by site name. An aggregator holds every site's key, to verify;
// an enforcer (a producer) only its own, to sign. A SiteKeys is immutable.
type SiteKeys struct {
	keys map[string][]byte
}

// ParseSiteKeys reads site keys: one per line, the site's name, white space, and the key
// in hex (at least MinSiteKeyLen bytes: `openssl rand -hex 32`); blank lines and lines
// starting with # are skipped. The name is everything before the last run of white
// space, so a name may not end with white space. A site named twice is an error.
func ParseSiteKeys(data []byte) (*SiteKeys, error) {
	k := &SiteKeys{keys: map[string][]byte{}}
	for n, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexAny(line, " \t")
		if i < 0 {
			return nil, fmt.Errorf("site keys line %d: want a site name and a hex key", n+1)
		}
		site, hexKey := strings.TrimSpace(line[:i]), line[i+1:]
		if err := validateSite(site); err != nil {
			return nil, fmt.Errorf("site keys line %d: %w", n+1, err)
		}
		key, err := hex.DecodeString(hexKey)
		if err != nil {
			return nil, fmt.Errorf("site keys line %d (site %q): key is not hex: %w", n+1, site, err)
		}
		if len(key) < MinSiteKeyLen {
			return nil, fmt.Errorf("site keys line %d (site %q): key of %d bytes, at least %d", n+1, site, len(key), MinSiteKeyLen)
		}
		if _, dup := k.keys[site]; dup {
			return nil, fmt.Errorf("site keys line %d: site %q given twice", n+1, site)
		}
		k.keys[site] = key
	}
	if len(k.keys) == 0 {
		return nil, fmt.Errorf("site keys: no key")
	}
	return k, nil
}

// LoadSiteKeys reads a file of site keys (ParseSiteKeys).
func LoadSiteKeys(path string) (*SiteKeys, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("site keys: %w", err)
	}
	k, err := ParseSiteKeys(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return k, nil
}

// Key returns site's key, and whether there is one. The key must not be modified.
func (k *SiteKeys) Key(site string) ([]byte, bool) {
	if k == nil {
		return nil, false
	}
	v, ok := k.keys[site]
	return v, ok
}

// Sites returns the sites that have a key, sorted.
func (k *SiteKeys) Sites() []string {
	if k == nil {
		return nil
	}
	out := make([]string, 0, len(k.keys))
	for s := range k.keys {
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}

// Verify reports whether mac (the record's HeaderSiteMAC; nil when absent) proves that
// value was written by site: an error wrapping ErrUnsigned, ErrUnknownSite or
// ErrBadSignature otherwise. It compares in constant time.
func (k *SiteKeys) Verify(site, value, mac []byte) error {
	if mac == nil {
		return errorf(ErrUnsigned, "site %q", printable(site))
	}
	key, ok := k.Key(string(site))
	if !ok {
		return errorf(ErrUnknownSite, "site %q", printable(site))
	}
	if !hmac.Equal(SiteMAC(key, value), mac) {
		return errorf(ErrBadSignature, "site %q", printable(site))
	}
	return nil
}

// printable returns b for an error message: valid UTF-8 as it is, else with its invalid
// bytes replaced, so that a log line stays readable.
func printable(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	return string(bytes.ToValidUTF8(b, []byte("\uFFFD")))
}
