package topics

import (
	"encoding/json"
	"errors"
	"fmt"
)

// Record validation errors. Decoders and encoders return errors that wrap exactly one of
// these, so callers can branch with errors.Is and count rejects by Reason.
var (
	ErrTruncated      = errors.New("truncated record")
	ErrTrailingBytes  = errors.New("trailing bytes after record")
	ErrUnknownVersion = errors.New("unknown record version")
	ErrBadJSON        = errors.New("malformed JSON record")
	ErrEmptyKey       = errors.New("empty key")
	ErrKeyTooLong     = errors.New("key too long")
	ErrReservedKey    = errors.New("key uses the reserved prefix")
	ErrBadUTF8        = errors.New("not valid UTF-8")
	ErrEmptySite      = errors.New("empty site")
	ErrSiteTooLong    = errors.New("site too long")
	ErrBadCount       = errors.New("count out of range")
	ErrBadWindow      = errors.New("window out of range")
	ErrBadTime        = errors.New("timestamp missing or out of range")
	ErrBadSites       = errors.New("site breakdown invalid")
	// ErrUnsigned, ErrBadSignature and ErrUnknownSite are a hits-topic record's failures
	// of site authentication (SiteKeys.Verify): no HeaderSiteMAC, one that does not match
	// the record, and a site no key is configured for.
	ErrUnsigned     = errors.New("record carries no site signature")
	ErrBadSignature = errors.New("site signature does not match the record")
	ErrUnknownSite  = errors.New("no key for the record's site")
)

var reasons = []struct {
	err    error
	reason string
}{
	{ErrTruncated, "truncated"},
	{ErrTrailingBytes, "trailing_bytes"},
	{ErrUnknownVersion, "unknown_version"},
	{ErrBadJSON, "bad_json"},
	{ErrEmptyKey, "empty_key"},
	{ErrKeyTooLong, "key_too_long"},
	{ErrReservedKey, "reserved_key"},
	{ErrBadUTF8, "bad_utf8"},
	{ErrEmptySite, "empty_site"},
	{ErrSiteTooLong, "site_too_long"},
	{ErrBadCount, "bad_count"},
	{ErrBadWindow, "bad_window"},
	{ErrBadTime, "bad_time"},
	{ErrBadSites, "bad_sites"},
	{ErrUnsigned, "unsigned"},
	{ErrBadSignature, "bad_signature"},
	{ErrUnknownSite, "unknown_site"},
}

// Reason returns a short, stable label for a validation error, suitable for a metric label
// such as bad_records_total{reason="key_too_long"}. Errors that wrap none of the Err*
// values give "other".
func Reason(err error) string {
	for _, r := range reasons {
		if errors.Is(err, r.err) {
			return r.reason
		}
	}
	return "other"
}

// Reasons lists every label Reason can return, so that metrics can be pre-initialised.
func Reasons() []string {
	out := make([]string, 0, len(reasons)+1)
	for _, r := range reasons {
		out = append(out, r.reason)
	}
	return append(out, "other")
}

func errorf(sentinel error, format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{sentinel}, args...)...)
}

func jsonMarshal(v any) ([]byte, error) { return json.Marshal(v) }
