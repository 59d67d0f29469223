package aggregator

import (
	"bytes"
	"encoding/binary"
	"math"
	"time"
	"unicode/utf8"

	"github.com/streamlimit/streamlimit/topics"
)

const maxWindowMillis = uint64(math.MaxInt64) / uint64(time.Millisecond)

// decodeFast decodes a binary (version 1) hit without allocating, leaving key and site
// pointing into b. It accepts only records that topics.DecodeHit accepts with the same
// values (see TestDecodeFastAgreesWithTopics); for anything else — JSON, other versions,
// any invalid field — it returns false and the caller uses topics.DecodeHit, which also
// names the error.
func decodeFast(b []byte, h *hitRef) bool {
	if len(b) == 0 || b[0] != 1 {
		return false
	}
	b = b[1:]
	kl, n := binary.Uvarint(b)
	if n <= 0 {
		return false
	}
	b = b[n:]
	sl, n := binary.Uvarint(b)
	if n <= 0 {
		return false
	}
	b = b[n:]
	if kl < 1 || kl > topics.MaxKeyLen || sl < 1 || sl > topics.MaxSiteLen || uint64(len(b)) < kl+sl {
		return false
	}
	h.key, h.site = b[:kl], b[kl:kl+sl]
	if bytes.HasPrefix(h.key, []byte(topics.ReservedPrefix)) || !utf8.Valid(h.key) || !utf8.Valid(h.site) {
		return false
	}
	b = b[kl+sl:]
	bs, n := binary.Varint(b)
	if n <= 0 {
		return false
	}
	b = b[n:]
	w, n := binary.Uvarint(b)
	if n <= 0 || w < 1 || w > maxWindowMillis {
		return false
	}
	b = b[n:]
	c, n := binary.Uvarint(b)
	if n <= 0 || c < 1 || c > math.MaxInt64 || n != len(b) {
		return false
	}
	h.bucketStart, h.window, h.count = bs, int64(w), int64(c)
	return true
}
