package topics

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Record limits, part of the contract (docs/records.md).
const (
	// MaxKeyLen is the longest counter key, in bytes.
	MaxKeyLen = 1024
	// MaxSiteLen is the longest site name, in bytes.
	MaxSiteLen = 128
	// ReservedPrefix starts every key that streamlimit itself writes to the counts topic
	// (heartbeats). Counter keys may not start with it.
	ReservedPrefix = "__streamlimit/"
	// HeaderRerouted is the Kafka record header that the aggregator puts on a hit it has
	// re-published to the partition that owns the hit's key, so that it is never re-routed
	// twice.
	HeaderRerouted = "streamlimit-rerouted"
)

const (
	hitVersion1   byte = 1
	hitVersion2   byte = 2
	countVersion1 byte = 1
	countVersion2 byte = 2
	jsonStart     byte = '{'
)

// SiteHeartbeatKey is the key of the site heartbeat, a hit record whose key is
// reserved: it carries no hits, only the news that Site is alive and has handed every hit
// of its buckets before BucketStart to Kafka (in that partition; a producer writes one to
// every partition of its hits topic). Replication carries it like any hit, so every data
// center's aggregator learns how recent its view of each site is; see Hit.IsSiteHeartbeat.
const SiteHeartbeatKey = ReservedPrefix + "alive"

// SiteSilentAfter is how long after its latest site heartbeat a site is taken as silent
// by default: three heartbeat periods of our producer (500 ms), so that a healthy site with
// replication lag and one late heartbeat is never taken as silent, while a cut site is
// within about a second and a half. Aggregators count a site cut off from them (silent,
// with every other site of its hits topic) as of its last heartbeat; enforcers take a
// silent site as possibly still admitting (enforcer.Config.SiteStaleAfter).
const SiteSilentAfter = 1500 * time.Millisecond

// SiteLeaveKey is the key of the site leave record: the last record a producer instance
// writes to each partition of its hits topic when it stops cleanly. It has the fields of a
// site heartbeat (Site, BucketStart as the time it left, Instance, Counter) and says that
// the instance will admit nothing more; once every instance of a site has left, the
// aggregators list the site as left and the enforcers stop reserving anything for it. A
// site that restarts under the same name simply resumes sending heartbeats. See
// Hit.IsSiteLeave.
const SiteLeaveKey = ReservedPrefix + "leave"

// Hit says that Key was hit Count times at Site during the bucket starting at BucketStart,
// toward a window of Window milliseconds, and that Denied more requests for it were refused
// there. A (Key, Window) pair is one counter. Only Count counts toward the limit; Count +
// Denied is the site's demand for the key, which sites use to share a hot key's room.
//
// A hit whose Key is SiteHeartbeatKey or SiteLeaveKey is a site record instead
// (IsSiteRecord): a heartbeat or a leave.
type Hit struct {
	// Key is the counter key, 1..MaxKeyLen bytes.
	Key string
	// Site is the unit that shares an exact counter (a process or a data center's Redis).
	Site string
	// BucketStart is the start of the producer's time bucket, in unix milliseconds.
	BucketStart int64
	// Window is the length of the window the hit counts toward, in milliseconds. Zero means
	// "the aggregator's default" and is only produced by a JSON record without "w".
	Window int64
	// Count is the number of admitted hits, ≥ 0.
	Count int64
	// Denied is the number of requests refused at Site in the bucket, ≥ 0. Count + Denied
	// is at least 1, except in a site record, where both are 0.
	Denied int64
	// Instance and Counter are set in site records only (each ≤ MaxSiteLen bytes,
	// optional): the producer instance that wrote it, and what holds the site's exact
	// count ("process:<instance>" for a site that is one process, "redis:<address>" for a
	// data center's Redis). Two instances of one site that count apart (one of them in its
	// own process) are a misconfiguration the aggregator reports: they would each admit
	// the site's whole share.
	Instance, Counter string
}

// IsSiteHeartbeat reports whether h is a site heartbeat rather than hits of a counter.
func (h Hit) IsSiteHeartbeat() bool { return h.Key == SiteHeartbeatKey }

// IsSiteLeave reports whether h is a site leave record (SiteLeaveKey).
func (h Hit) IsSiteLeave() bool { return h.Key == SiteLeaveKey }

// IsSiteRecord reports whether h is a site heartbeat or a site leave record: it carries no
// hits, only news of its site, and is encoded as a heartbeat is.
func (h Hit) IsSiteRecord() bool { return h.IsSiteHeartbeat() || h.IsSiteLeave() }

// BucketTime returns BucketStart as a time.Time.
func (h Hit) BucketTime() time.Time { return time.UnixMilli(h.BucketStart) }

// WindowDuration returns Window as a time.Duration.
func (h Hit) WindowDuration() time.Duration { return time.Duration(h.Window) * time.Millisecond }

// Validate reports whether h obeys the record limits. A zero Window is accepted (it means
// the aggregator's default).
func (h Hit) Validate() error {
	if h.IsSiteRecord() {
		if err := validateSite(h.Site); err != nil {
			return err
		}
		if h.Window != 0 || h.Count != 0 || h.Denied != 0 {
			return errorf(ErrBadCount, "site record with window %d, count %d, denied %d", h.Window, h.Count, h.Denied)
		}
		for _, v := range []string{h.Instance, h.Counter} {
			if len(v) > MaxSiteLen || !utf8.ValidString(v) {
				return errorf(ErrSiteTooLong, "site record instance or counter of %d bytes (at most %d of UTF-8)", len(v), MaxSiteLen)
			}
		}
		return nil
	}
	if h.Instance != "" || h.Counter != "" {
		return errorf(ErrBadCount, "instance and counter belong to site records")
	}
	if err := validateKey(h.Key); err != nil {
		return err
	}
	if err := validateSite(h.Site); err != nil {
		return err
	}
	if h.Window < 0 {
		return errorf(ErrBadWindow, "window %d ms", h.Window)
	}
	if h.Count < 0 || h.Denied < 0 || h.Count > math.MaxInt64-h.Denied || h.Count+h.Denied < 1 {
		return errorf(ErrBadCount, "count %d, denied %d", h.Count, h.Denied)
	}
	return nil
}

func validateKey(k string) error {
	switch {
	case k == "":
		return ErrEmptyKey
	case len(k) > MaxKeyLen:
		return errorf(ErrKeyTooLong, "%d bytes, at most %d", len(k), MaxKeyLen)
	case strings.HasPrefix(k, ReservedPrefix):
		return errorf(ErrReservedKey, "%q", ReservedPrefix)
	case !utf8.ValidString(k):
		// Keys travel as JSON strings too (JSON hits, counts --json), which cannot carry
		// other bytes; rules' counter keys percent-encode them.
		return errorf(ErrBadUTF8, "key")
	}
	return nil
}

func validateSite(s string) error {
	switch {
	case s == "":
		return ErrEmptySite
	case len(s) > MaxSiteLen:
		return errorf(ErrSiteTooLong, "%d bytes, at most %d", len(s), MaxSiteLen)
	case !utf8.ValidString(s):
		return errorf(ErrBadUTF8, "site")
	}
	return nil
}

// AppendBinary appends the binary encoding of h to dst: version 1 when h has no Denied
// requests and is not a site record (what every aggregator reads), version 2 otherwise.
// It fails, appending nothing, if h is invalid or (but for a site record) has no window.
// It does not allocate when dst has room.
func (h Hit) AppendBinary(dst []byte) ([]byte, error) {
	if err := h.Validate(); err != nil {
		return dst, err
	}
	if h.Window < 1 && !h.IsSiteRecord() {
		return dst, errorf(ErrBadWindow, "binary hits need a window, got %d ms", h.Window)
	}
	v2 := h.Denied != 0 || h.IsSiteRecord()
	if v2 {
		dst = append(dst, hitVersion2)
	} else {
		dst = append(dst, hitVersion1)
	}
	dst = binary.AppendUvarint(dst, uint64(len(h.Key)))
	dst = binary.AppendUvarint(dst, uint64(len(h.Site)))
	dst = append(dst, h.Key...)
	dst = append(dst, h.Site...)
	dst = binary.AppendVarint(dst, h.BucketStart)
	dst = binary.AppendUvarint(dst, uint64(h.Window))
	dst = binary.AppendUvarint(dst, uint64(h.Count))
	if v2 {
		dst = binary.AppendUvarint(dst, uint64(h.Denied))
	}
	if h.IsSiteRecord() {
		dst = binary.AppendUvarint(dst, uint64(len(h.Instance)))
		dst = append(dst, h.Instance...)
		dst = binary.AppendUvarint(dst, uint64(len(h.Counter)))
		dst = append(dst, h.Counter...)
	}
	return dst, nil
}

// MarshalBinary returns the binary encoding of h.
func (h Hit) MarshalBinary() ([]byte, error) {
	return h.AppendBinary(make([]byte, 0, 16+len(h.Key)+len(h.Site)))
}

// AppendJSON appends the JSON encoding of h to dst; Window is left out when zero, Denied
// when zero, and a site record is written as {"key":…,"site":…,"ts":…}.
func (h Hit) AppendJSON(dst []byte) ([]byte, error) {
	if err := h.Validate(); err != nil {
		return dst, err
	}
	dst = append(dst, `{"key":`...)
	dst = appendJSONString(dst, h.Key)
	dst = append(dst, `,"site":`...)
	dst = appendJSONString(dst, h.Site)
	dst = append(dst, `,"ts":`...)
	dst = strconv.AppendInt(dst, h.BucketStart, 10)
	if h.IsSiteRecord() {
		if h.Instance != "" {
			dst = append(dst, `,"instance":`...)
			dst = appendJSONString(dst, h.Instance)
		}
		if h.Counter != "" {
			dst = append(dst, `,"counter":`...)
			dst = appendJSONString(dst, h.Counter)
		}
		return append(dst, '}'), nil
	}
	if h.Window != 0 {
		dst = append(dst, `,"w":`...)
		dst = strconv.AppendInt(dst, h.Window, 10)
	}
	dst = append(dst, `,"n":`...)
	dst = strconv.AppendInt(dst, h.Count, 10)
	if h.Denied != 0 {
		dst = append(dst, `,"d":`...)
		dst = strconv.AppendInt(dst, h.Denied, 10)
	}
	return append(dst, '}'), nil
}

// MarshalJSON returns the JSON encoding of h (the contract's JSON form).
func (h Hit) MarshalJSON() ([]byte, error) { return h.AppendJSON(nil) }

// UnmarshalJSON decodes the contract's JSON form into h, with the same validation as
// DecodeHit.
func (h *Hit) UnmarshalJSON(b []byte) error {
	v, err := decodeHitJSON(b)
	if err != nil {
		return err
	}
	*h = v
	return nil
}

// DecodeHit decodes a hit record value in either encoding (told apart by its first byte)
// and validates it. The binary form costs one allocation (key and site share a string).
func DecodeHit(b []byte) (Hit, error) {
	if len(b) == 0 {
		return Hit{}, errorf(ErrTruncated, "empty value")
	}
	switch b[0] {
	case hitVersion1, hitVersion2:
		return decodeHitBinary(b[1:], b[0])
	case jsonStart:
		return decodeHitJSON(b)
	case hitBatchVersion:
		return Hit{}, errorf(ErrUnknownVersion, "a hit batch (version 3) holds several hits: read it with ReadHitBatch or DecodeHits")
	default:
		return Hit{}, errorf(ErrUnknownVersion, "first byte 0x%02x", b[0])
	}
}

func decodeHitBinary(b []byte, version byte) (Hit, error) {
	var r reader
	r.b = b
	kl := r.uvarint()
	sl := r.uvarint()
	if r.err != nil {
		return Hit{}, r.err
	}
	if kl > MaxKeyLen {
		return Hit{}, errorf(ErrKeyTooLong, "%d bytes, at most %d", kl, MaxKeyLen)
	}
	if sl > MaxSiteLen {
		return Hit{}, errorf(ErrSiteTooLong, "%d bytes, at most %d", sl, MaxSiteLen)
	}
	ks := r.bytes(int(kl + sl))
	if r.err != nil {
		return Hit{}, r.err
	}
	both := string(ks)
	h := Hit{Key: both[:kl], Site: both[kl:]}
	h.BucketStart = r.varint()
	w := r.uvarint()
	n := r.uvarint()
	var d uint64
	if version == hitVersion2 {
		d = r.uvarint()
	}
	if h.IsSiteRecord() && r.err == nil && len(r.b) > 0 {
		for _, f := range []*string{&h.Instance, &h.Counter} {
			l := r.uvarint()
			if r.err == nil && l > MaxSiteLen {
				return Hit{}, errorf(ErrSiteTooLong, "site record field of %d bytes", l)
			}
			*f = string(r.bytes(int(l)))
		}
	}
	if r.err != nil {
		return Hit{}, r.err
	}
	if len(r.b) != 0 {
		return Hit{}, errorf(ErrTrailingBytes, "%d bytes", len(r.b))
	}
	if (w < 1 && !h.IsSiteRecord()) || w > maxMillis {
		return Hit{}, errorf(ErrBadWindow, "window %d ms", w)
	}
	if (version == hitVersion1 && n < 1) || n > maxCount || d > maxCount {
		return Hit{}, errorf(ErrBadCount, "count %d, denied %d", n, d)
	}
	h.Window, h.Count, h.Denied = int64(w), int64(n), int64(d)
	return h, h.Validate()
}

// maxMillis bounds windows to about 292 years, keeping them inside time.Duration.
const maxMillis = uint64(1<<63-1) / uint64(time.Millisecond)

// maxCount keeps counts inside int64.
const maxCount = uint64(1<<63 - 1)

type hitJSON struct {
	Key  *string `json:"key"`
	Site *string `json:"site"`
	TS   *int64  `json:"ts"`
	W    *int64  `json:"w"`
	N    *int64  `json:"n"`
	D    *int64  `json:"d"`
	// Site records only.
	Instance string `json:"instance"`
	Counter  string `json:"counter"`
}

func decodeHitJSON(b []byte) (Hit, error) {
	var j hitJSON
	if err := decodeJSONStrict(b, &j); err != nil {
		return Hit{}, err
	}
	switch {
	case j.Key == nil:
		return Hit{}, errorf(ErrEmptyKey, `missing "key"`)
	case j.Site == nil:
		return Hit{}, errorf(ErrEmptySite, `missing "site"`)
	case j.TS == nil:
		return Hit{}, errorf(ErrBadTime, `missing "ts"`)
	}
	h := Hit{Key: *j.Key, Site: *j.Site, BucketStart: *j.TS, Count: 1}
	if h.IsSiteRecord() {
		if j.W != nil || j.N != nil || j.D != nil {
			return Hit{}, errorf(ErrBadCount, "a site record has no w, n or d")
		}
		h.Count, h.Instance, h.Counter = 0, j.Instance, j.Counter
		return h, h.Validate()
	}
	if j.W != nil {
		if *j.W < 1 || uint64(*j.W) > maxMillis {
			return Hit{}, errorf(ErrBadWindow, "w %d ms", *j.W)
		}
		h.Window = *j.W
	}
	if j.N != nil {
		h.Count = *j.N
	}
	if j.D != nil {
		h.Denied = *j.D
		if j.N == nil {
			// "n" defaults to 1 only for a record that reports hits; a record with "d"
			// alone reports refused requests.
			h.Count = 0
		}
	}
	return h, h.Validate()
}

// decodeJSONStrict decodes exactly one JSON object from b into v; anything after it other
// than white space is an error, and so is text that is not valid UTF-8 (ErrBadUTF8).
func decodeJSONStrict(b []byte, v any) error {
	if err := validJSONText(b); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(v); err != nil {
		return errorf(ErrBadJSON, "%v", err)
	}
	if dec.More() {
		return errorf(ErrTrailingBytes, "after JSON object")
	}
	if _, err := dec.Token(); err == nil {
		return errorf(ErrTrailingBytes, "after JSON object")
	}
	return nil
}

// validJSONText rejects JSON text that is not valid UTF-8, or that escapes a lone UTF-16
// surrogate (\ud800 without its pair). encoding/json would turn either into U+FFFD
// without a word, so that two different keys sent by a careless producer would share one
// counter; the binary format refuses such keys, and JSON must not be a way around it.
func validJSONText(b []byte) error {
	if !utf8.Valid(b) {
		return errorf(ErrBadUTF8, "JSON text is not valid UTF-8")
	}
	for i := 0; i < len(b); i++ {
		if b[i] != '\\' {
			continue
		}
		if i+1 < len(b) && b[i+1] != 'u' {
			i++ // \" \\ \n ...: the escaped byte is not the start of another escape
			continue
		}
		r, ok := hex4(b, i+2)
		if !ok {
			continue // malformed: the decoder reports it
		}
		switch {
		case r >= 0xDC00 && r <= 0xDFFF:
			return errorf(ErrBadUTF8, "lone low surrogate \\u%04x", r)
		case r >= 0xD800 && r <= 0xDBFF:
			lo, ok := rune(0), i+7 < len(b) && b[i+6] == '\\' && b[i+7] == 'u'
			if ok {
				lo, ok = hex4(b, i+8)
			}
			if !ok || lo < 0xDC00 || lo > 0xDFFF {
				return errorf(ErrBadUTF8, "lone high surrogate \\u%04x", r)
			}
			i += 11 // the pair
		default:
			i += 5
		}
	}
	return nil
}

// hex4 parses the 4 hex digits at b[i:i+4].
func hex4(b []byte, i int) (rune, bool) {
	if i+4 > len(b) {
		return 0, false
	}
	var r rune
	for _, c := range b[i : i+4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

// appendJSONString appends s as a JSON string, escaping what JSON requires.
func appendJSONString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' && c < 0x7f {
			continue
		}
		if c >= 0x7f {
			// Multi-byte UTF-8 passes through; invalid UTF-8 becomes U+FFFD, as
			// encoding/json does, so that the output is always valid JSON.
			r, size := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError && size == 1 {
				dst = append(dst, s[start:i]...)
				dst = append(dst, `\ufffd`...)
				start = i + 1
				continue
			}
			if r == '\u2028' || r == '\u2029' {
				dst = append(dst, s[start:i]...)
				dst = append(dst, `\u202`...)
				dst = append(dst, hex[r&0xf])
				start = i + size
			}
			i += size - 1
			continue
		}
		dst = append(dst, s[start:i]...)
		switch c {
		case '"', '\\':
			dst = append(dst, '\\', c)
		case '\n':
			dst = append(dst, '\\', 'n')
		case '\r':
			dst = append(dst, '\\', 'r')
		case '\t':
			dst = append(dst, '\\', 't')
		default:
			dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		}
		start = i + 1
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// reader reads varint-framed fields, remembering the first error.
type reader struct {
	b   []byte
	err error
}

func (r *reader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.fail(n)
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) varint() int64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.fail(n)
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) fail(n int) {
	if n == 0 {
		r.err = errorf(ErrTruncated, "varint cut short")
	} else {
		r.err = errorf(ErrTruncated, "varint overflows 64 bits")
	}
}

func (r *reader) bytes(n int) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || n > len(r.b) {
		r.err = errorf(ErrTruncated, "need %d bytes, have %d", n, len(r.b))
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

func (r *reader) float64() float64 {
	v := r.bytes(8)
	if r.err != nil {
		return 0
	}
	return math.Float64frombits(binary.LittleEndian.Uint64(v))
}
