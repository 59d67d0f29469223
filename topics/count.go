package topics

import (
	"encoding/binary"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Count is the aggregator's absolute sliding-window count of one counter at one instant,
// across all sites, with the per-site breakdown. It is the value of the compacted counts
// topic under the counter key.
type Count struct {
	// Key is the counter key.
	Key string
	// Window is the window length in milliseconds (≥ 1).
	Window int64
	// AsOf is the instant the count describes, in unix milliseconds.
	AsOf int64
	// Total is the count in the window ending at AsOf, over all sites. It is fractional
	// because the oldest sub-window is interpolated.
	Total float64
	// SubBuckets is the number of sub-window buckets the aggregator splits Window into (0:
	// not stated, as in a version 1 record). Enforcers count their own site on the same
	// grid and refuse counts made on another.
	SubBuckets int
	// Sites is the breakdown by site, sorted by Site, each site at most once.
	Sites []SiteCount
}

// SiteCount is one site's part of a Count.
type SiteCount struct {
	// Site names the site.
	Site string
	// Count is the site's admitted hits in the window.
	Count float64
	// Demand is the site's recent demand for the key: its requests, admitted or denied,
	// each weighted by e^(−age/τ) at AsOf, τ being DemandTimeConstant, so that Demand / τ
	// is the site's recent request rate. Sites share a hot key's room in proportion to it.
	// 0 in a version 1 record.
	Demand float64
}

// DemandTimeConstant is τ of SiteCount.Demand. It is part of the record's meaning, not a
// setting: an enforcer reads a demand as a rate by it, so every aggregator must decay by
// the same τ. 1 s follows a client that moves between data centers within about a
// pipeline lag's multiple, and smooths a second's bursts.
const DemandTimeConstant = time.Second

// Site returns the count of site s, or 0 when s has no entry.
func (c *Count) Site(s string) float64 {
	i, ok := slices.BinarySearchFunc(c.Sites, s, func(e SiteCount, s string) int { return strings.Compare(e.Site, s) })
	if !ok {
		return 0
	}
	return c.Sites[i].Count
}

// AsOfTime returns AsOf as a time.Time.
func (c *Count) AsOfTime() time.Time { return time.UnixMilli(c.AsOf) }

// WindowDuration returns Window as a time.Duration.
func (c *Count) WindowDuration() time.Duration { return time.Duration(c.Window) * time.Millisecond }

// Validate reports whether c obeys the record limits.
func (c *Count) Validate() error {
	if err := validateKey(c.Key); err != nil {
		return err
	}
	if c.Window < 1 || uint64(c.Window) > maxMillis {
		return errorf(ErrBadWindow, "window %d ms", c.Window)
	}
	if c.SubBuckets < 0 || c.SubBuckets > MaxSubBuckets {
		return errorf(ErrBadWindow, "sub-buckets %d", c.SubBuckets)
	}
	if !validAmount(c.Total) {
		return errorf(ErrBadCount, "total %v", c.Total)
	}
	for i, s := range c.Sites {
		if err := validateSite(s.Site); err != nil {
			return err
		}
		if !validAmount(s.Count) || !validAmount(s.Demand) {
			return errorf(ErrBadCount, "site %q count %v, demand %v", s.Site, s.Count, s.Demand)
		}
		if i > 0 && c.Sites[i-1].Site >= s.Site {
			return errorf(ErrBadSites, "sites not sorted and unique at %q", s.Site)
		}
	}
	return nil
}

// MaxSubBuckets is the largest sub-bucket count a count record may state.
const MaxSubBuckets = 1 << 16

func validAmount(f float64) bool { return f >= 0 && !math.IsInf(f, 0) && !math.IsNaN(f) }

// AppendBinary appends the binary (version 2) encoding of c to dst, or fails if c is
// invalid. It does not allocate when dst has room.
func (c *Count) AppendBinary(dst []byte) ([]byte, error) {
	if err := c.Validate(); err != nil {
		return dst, err
	}
	dst = append(dst, countVersion2)
	dst = binary.AppendUvarint(dst, uint64(len(c.Key)))
	dst = append(dst, c.Key...)
	dst = binary.AppendUvarint(dst, uint64(c.Window))
	dst = binary.AppendVarint(dst, c.AsOf)
	dst = binary.AppendUvarint(dst, uint64(c.SubBuckets))
	dst = binary.LittleEndian.AppendUint64(dst, math.Float64bits(c.Total))
	dst = binary.AppendUvarint(dst, uint64(len(c.Sites)))
	for _, s := range c.Sites {
		dst = binary.AppendUvarint(dst, uint64(len(s.Site)))
		dst = append(dst, s.Site...)
		dst = binary.LittleEndian.AppendUint64(dst, math.Float64bits(s.Count))
		dst = binary.LittleEndian.AppendUint64(dst, math.Float64bits(s.Demand))
	}
	return dst, nil
}

// MarshalBinary returns the binary encoding of c.
func (c *Count) MarshalBinary() ([]byte, error) {
	return c.AppendBinary(make([]byte, 0, 36+len(c.Key)+len(c.Sites)*24))
}

// AppendJSON appends the JSON encoding of c to dst, or fails if c is invalid.
func (c *Count) AppendJSON(dst []byte) ([]byte, error) {
	if err := c.Validate(); err != nil {
		return dst, err
	}
	dst = append(dst, `{"key":`...)
	dst = appendJSONString(dst, c.Key)
	dst = append(dst, `,"w":`...)
	dst = strconv.AppendInt(dst, c.Window, 10)
	dst = append(dst, `,"asof":`...)
	dst = strconv.AppendInt(dst, c.AsOf, 10)
	dst = append(dst, `,"total":`...)
	dst = strconv.AppendFloat(dst, c.Total, 'g', -1, 64)
	if c.SubBuckets != 0 {
		dst = append(dst, `,"sub":`...)
		dst = strconv.AppendInt(dst, int64(c.SubBuckets), 10)
	}
	dst = append(dst, `,"sites":`...)
	dst = appendSiteMap(dst, c.Sites, func(s SiteCount) float64 { return s.Count })
	if slices.ContainsFunc(c.Sites, func(s SiteCount) bool { return s.Demand != 0 }) {
		dst = append(dst, `,"demand":`...)
		dst = appendSiteMap(dst, c.Sites, func(s SiteCount) float64 { return s.Demand })
	}
	return append(dst, '}'), nil
}

// appendSiteMap appends a JSON object of site → value(site).
func appendSiteMap(dst []byte, sites []SiteCount, value func(SiteCount) float64) []byte {
	dst = append(dst, '{')
	for i, s := range sites {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = appendJSONString(dst, s.Site)
		dst = append(dst, ':')
		dst = strconv.AppendFloat(dst, value(s), 'g', -1, 64)
	}
	return append(dst, '}')
}

// MarshalJSON returns the JSON encoding of c.
func (c Count) MarshalJSON() ([]byte, error) { return c.AppendJSON(nil) }

// UnmarshalJSON decodes the contract's JSON form into c, with the same validation as
// DecodeCount.
func (c *Count) UnmarshalJSON(b []byte) error {
	v, err := decodeCountJSON(b)
	if err != nil {
		return err
	}
	*c = v
	return nil
}

// DecodeCount decodes a count record value in either encoding and validates it. A nil or
// empty value is a tombstone and is not a Count: callers check for it first.
func DecodeCount(b []byte) (Count, error) {
	if len(b) == 0 {
		return Count{}, errorf(ErrTruncated, "empty value (a tombstone is not a count)")
	}
	switch b[0] {
	case countVersion1, countVersion2:
		return decodeCountBinary(b[1:], b[0])
	case jsonStart:
		return decodeCountJSON(b)
	default:
		return Count{}, errorf(ErrUnknownVersion, "first byte 0x%02x", b[0])
	}
}

func decodeCountBinary(b []byte, version byte) (Count, error) {
	r := reader{b: b}
	kl := r.uvarint()
	if r.err == nil && kl > MaxKeyLen {
		return Count{}, errorf(ErrKeyTooLong, "%d bytes, at most %d", kl, MaxKeyLen)
	}
	key := r.bytes(int(kl))
	w := r.uvarint()
	asof := r.varint()
	var sub uint64
	perSite := 9
	if version == countVersion2 {
		sub = r.uvarint()
		perSite = 17
	}
	total := r.float64()
	n := r.uvarint()
	if r.err != nil {
		return Count{}, r.err
	}
	// Each site takes at least perSite bytes, which bounds the allocation below by the
	// input.
	if n > uint64(len(r.b)/perSite) {
		return Count{}, errorf(ErrTruncated, "%d sites in %d bytes", n, len(r.b))
	}
	if w > maxMillis {
		return Count{}, errorf(ErrBadWindow, "window %d ms", w)
	}
	if sub > MaxSubBuckets {
		return Count{}, errorf(ErrBadWindow, "sub-buckets %d", sub)
	}
	c := Count{Key: string(key), Window: int64(w), AsOf: asof, Total: total, SubBuckets: int(sub)}
	if n > 0 {
		c.Sites = make([]SiteCount, n)
	}
	for i := range c.Sites {
		sl := r.uvarint()
		if r.err == nil && sl > MaxSiteLen {
			return Count{}, errorf(ErrSiteTooLong, "%d bytes, at most %d", sl, MaxSiteLen)
		}
		site := r.bytes(int(sl))
		v := r.float64()
		var d float64
		if version == countVersion2 {
			d = r.float64()
		}
		if r.err != nil {
			return Count{}, r.err
		}
		c.Sites[i] = SiteCount{Site: string(site), Count: v, Demand: d}
	}
	if len(r.b) != 0 {
		return Count{}, errorf(ErrTrailingBytes, "%d bytes", len(r.b))
	}
	return c, c.Validate()
}

type countJSON struct {
	Key    *string            `json:"key"`
	W      *int64             `json:"w"`
	AsOf   *int64             `json:"asof"`
	Total  *float64           `json:"total"`
	Sub    *int               `json:"sub"`
	Sites  map[string]float64 `json:"sites"`
	Demand map[string]float64 `json:"demand"`
}

func decodeCountJSON(b []byte) (Count, error) {
	var j countJSON
	if err := decodeJSONStrict(b, &j); err != nil {
		return Count{}, err
	}
	switch {
	case j.Key == nil:
		return Count{}, errorf(ErrEmptyKey, `missing "key"`)
	case j.W == nil:
		return Count{}, errorf(ErrBadWindow, `missing "w"`)
	case j.AsOf == nil:
		return Count{}, errorf(ErrBadTime, `missing "asof"`)
	case j.Total == nil:
		return Count{}, errorf(ErrBadCount, `missing "total"`)
	}
	c := Count{Key: *j.Key, Window: *j.W, AsOf: *j.AsOf, Total: *j.Total}
	if j.Sub != nil {
		c.SubBuckets = *j.Sub
	}
	for s := range j.Demand {
		if _, ok := j.Sites[s]; !ok {
			return Count{}, errorf(ErrBadSites, "demand for site %q, which has no count", s)
		}
	}
	if len(j.Sites) > 0 {
		c.Sites = make([]SiteCount, 0, len(j.Sites))
		for s, v := range j.Sites {
			c.Sites = append(c.Sites, SiteCount{Site: s, Count: v, Demand: j.Demand[s]})
		}
		slices.SortFunc(c.Sites, func(a, b SiteCount) int { return strings.Compare(a.Site, b.Site) })
	}
	return c, c.Validate()
}
