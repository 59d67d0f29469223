package topics

import (
	"bytes"
	"encoding/binary"
	"math"
	"unicode/utf8"
)

// HitBatchKey is the record key of a hit batch: several hit records of one site in one
// Kafka record, written by streamlimit's producer to the partition that owns every key in
// it. Kafka's own costs (the client's and the broker's) are per record, so that a batch of
// a hundred hits costs about what one hit record does; see docs/records.md.
const HitBatchKey = ReservedPrefix + "hits"

// hitBatchVersion is the first byte of a hit batch's value.
const hitBatchVersion byte = 3

// IsHitBatch reports whether a hit record value is a hit batch (binary version 3).
func IsHitBatch(value []byte) bool { return len(value) > 0 && value[0] == hitBatchVersion }

// AppendHitBatch appends the start of a hit batch of site to dst; AppendToBatch then
// appends its hits, at least one. It fails, appending nothing, if site is invalid.
func AppendHitBatch(dst []byte, site string) ([]byte, error) {
	if err := validateSite(site); err != nil {
		return dst, err
	}
	dst = append(dst, hitBatchVersion)
	dst = binary.AppendUvarint(dst, uint64(len(site)))
	return append(dst, site...), nil
}

// AppendToBatch appends h to a hit batch started by AppendHitBatch: its key, bucket start,
// window, count and denied count (h.Site is not written: the batch's site is every hit's).
// It fails, appending nothing, if h is invalid, a site record, or has no window. It does
// not allocate when dst has room.
func (h Hit) AppendToBatch(dst []byte) ([]byte, error) {
	if h.IsSiteRecord() {
		return dst, errorf(ErrReservedKey, "a site record cannot be in a hit batch")
	}
	if h.Window < 1 {
		return dst, errorf(ErrBadWindow, "binary hits need a window, got %d ms", h.Window)
	}
	if err := validateHitFields(h.Key, h.Window, h.Count, h.Denied); err != nil {
		return dst, err
	}
	dst = binary.AppendUvarint(dst, uint64(len(h.Key)))
	dst = append(dst, h.Key...)
	dst = binary.AppendVarint(dst, h.BucketStart)
	dst = binary.AppendUvarint(dst, uint64(h.Window))
	dst = binary.AppendUvarint(dst, uint64(h.Count))
	return binary.AppendUvarint(dst, uint64(h.Denied)), nil
}

// validateHitFields checks what a hit of a batch carries besides its site.
func validateHitFields(key string, window, count, denied int64) error {
	if err := validateKey(key); err != nil {
		return err
	}
	if window < 1 || uint64(window) > maxMillis {
		return errorf(ErrBadWindow, "window %d ms", window)
	}
	if count < 0 || denied < 0 || count > math.MaxInt64-denied || count+denied < 1 {
		return errorf(ErrBadCount, "count %d, denied %d", count, denied)
	}
	return nil
}

// BatchHit is one hit of a hit batch as HitBatch reads it: Key points into the record's
// value, and the batch's Site is every hit's site.
type BatchHit struct {
	Key                                []byte
	BucketStart, Window, Count, Denied int64
}

// HitBatch reads the hits of a hit batch without allocating. ReadHitBatch checks the
// whole batch first, so that a batch is counted whole or not at all.
type HitBatch struct {
	// Site is the site of every hit, pointing into the record's value.
	Site []byte
	// Len is the number of hits.
	Len  int
	rest []byte
}

// ReadHitBatch checks a hit batch record value (version byte 3, the site, then one hit or
// more) and returns a reader of its hits. The error wraps one of the Err* sentinels, as
// DecodeHit's do.
func ReadHitBatch(value []byte) (HitBatch, error) {
	site, rest, err := readBatchHead(value)
	if err != nil {
		return HitBatch{}, err
	}
	b := HitBatch{Site: site, rest: rest}
	for c := b; len(c.rest) > 0; b.Len++ {
		var h BatchHit
		if err := c.next(&h, true); err != nil {
			return HitBatch{}, err
		}
	}
	return b, nil
}

// AppendBatchHits checks a hit batch record value as ReadHitBatch does, with the same
// errors, and appends its hits to dst; site points into value, as do the hits' keys. It
// reads the value once, where ReadHitBatch and Next read it twice (once to check the whole
// batch, once to hand out its hits): for a reader that counts a batch whole or not at all and
// can keep its hits meanwhile. On an error it returns dst as it was.
func AppendBatchHits(dst []BatchHit, value []byte) (site []byte, hits []BatchHit, err error) {
	site, rest, err := readBatchHead(value)
	if err != nil {
		return nil, dst, err
	}
	n := len(dst)
	b := HitBatch{rest: rest}
	for len(b.rest) > 0 {
		dst = append(dst, BatchHit{})
		if err := b.next(&dst[len(dst)-1], true); err != nil {
			clear(dst[n:])
			return nil, dst[:n], err
		}
	}
	return site, dst, nil
}

// readBatchHead checks a hit batch's version byte and site, and that hits follow; it
// returns the site and the hits' bytes.
func readBatchHead(value []byte) (site, rest []byte, err error) {
	if !IsHitBatch(value) {
		if len(value) == 0 {
			return nil, nil, errorf(ErrTruncated, "empty value")
		}
		return nil, nil, errorf(ErrUnknownVersion, "first byte 0x%02x is not a hit batch", value[0])
	}
	r := reader{b: value[1:]}
	site = r.bytes(int(min(r.uvarint(), MaxSiteLen+1)))
	if r.err != nil {
		return nil, nil, r.err
	}
	if len(site) == 0 {
		return nil, nil, errorf(ErrEmptySite, "hit batch")
	}
	if len(site) > MaxSiteLen {
		return nil, nil, errorf(ErrSiteTooLong, "site of %d bytes or more (at most %d)", len(site), MaxSiteLen)
	}
	if !utf8.Valid(site) {
		return nil, nil, errorf(ErrBadUTF8, "site")
	}
	if len(r.b) == 0 {
		return nil, nil, errorf(ErrTruncated, "hit batch with no hits")
	}
	return site, r.b, nil
}

// Next reads the next hit into h, and reports false when there is none left.
func (b *HitBatch) Next(h *BatchHit) bool {
	if len(b.rest) == 0 {
		return false
	}
	_ = b.next(h, false) // checked by ReadHitBatch
	return true
}

// next reads one hit, checking it when check is set.
func (b *HitBatch) next(h *BatchHit, check bool) error {
	r := reader{b: b.rest}
	kl := r.uvarint()
	if check && kl > MaxKeyLen {
		return errorf(ErrKeyTooLong, "key of %d bytes (at most %d)", kl, MaxKeyLen)
	}
	h.Key = r.bytes(int(kl))
	h.BucketStart = r.varint()
	w, c, d := r.uvarint(), r.uvarint(), r.uvarint()
	if r.err != nil {
		return r.err
	}
	if check {
		if w > maxMillis || c > maxCount || d > maxCount {
			return errorf(ErrBadCount, "window %d, count %d, denied %d out of range", w, c, d)
		}
		if err := validateHitFieldsBytes(h.Key, int64(w), int64(c), int64(d)); err != nil {
			return err
		}
	}
	h.Window, h.Count, h.Denied = int64(w), int64(c), int64(d)
	b.rest = r.b
	return nil
}

// validateHitFieldsBytes is validateHitFields for a key given as bytes, without
// allocating.
func validateHitFieldsBytes(key []byte, window, count, denied int64) error {
	switch {
	case len(key) == 0:
		return errorf(ErrEmptyKey, "hit batch")
	case len(key) > MaxKeyLen:
		return errorf(ErrKeyTooLong, "key of %d bytes (at most %d)", len(key), MaxKeyLen)
	case bytes.HasPrefix(key, []byte(ReservedPrefix)):
		return errorf(ErrReservedKey, "key %q", key)
	case !utf8.Valid(key):
		return errorf(ErrBadUTF8, "key")
	case window < 1:
		return errorf(ErrBadWindow, "window %d ms", window)
	case count > math.MaxInt64-denied || count+denied < 1:
		return errorf(ErrBadCount, "count %d, denied %d", count, denied)
	}
	return nil
}

// DecodeHits decodes a hit record value of any kind — one hit or a site record in either
// encoding (DecodeHit), or a hit batch — into the hits it holds, each with its Site set.
// It is for tools and tests; the aggregator reads batches with ReadHitBatch.
func DecodeHits(value []byte) ([]Hit, error) {
	if !IsHitBatch(value) {
		h, err := DecodeHit(value)
		if err != nil {
			return nil, err
		}
		return []Hit{h}, nil
	}
	b, err := ReadHitBatch(value)
	if err != nil {
		return nil, err
	}
	site := string(b.Site)
	out := make([]Hit, 0, b.Len)
	var h BatchHit
	for b.Next(&h) {
		out = append(out, Hit{Key: string(h.Key), Site: site, BucketStart: h.BucketStart, Window: h.Window, Count: h.Count, Denied: h.Denied})
	}
	return out, nil
}

// ReadHit reads the common hit record — one hit in binary version 1 — without allocating:
// h.Key and the site returned point into value. It reports false for anything else (JSON,
// other versions, site records, any invalid field), which DecodeHit decodes or rejects
// with the reason. What it accepts, DecodeHit accepts with the same values, so that a
// reader may try it first and fall back to DecodeHit.
func ReadHit(value []byte, h *BatchHit) (site []byte, ok bool) {
	if len(value) == 0 || value[0] != hitVersion1 {
		return nil, false
	}
	r := reader{b: value[1:]}
	kl, sl := r.uvarint(), r.uvarint()
	if r.err != nil || kl > MaxKeyLen || sl < 1 || sl > MaxSiteLen {
		return nil, false
	}
	ks := r.bytes(int(kl + sl))
	bs := r.varint()
	w, c := r.uvarint(), r.uvarint()
	if r.err != nil || len(r.b) != 0 || w > maxMillis || c > maxCount {
		return nil, false
	}
	key, site := ks[:kl], ks[kl:]
	if !utf8.Valid(site) || validateHitFieldsBytes(key, int64(w), int64(c), 0) != nil {
		return nil, false
	}
	*h = BatchHit{Key: key, BucketStart: bs, Window: int64(w), Count: int64(c)}
	return site, true
}
