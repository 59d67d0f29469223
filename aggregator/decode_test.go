package aggregator

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/streamlimit/streamlimit/topics"
)

// Every record the fast path accepts, topics.DecodeHit accepts with the same values, and
// every valid binary hit takes the fast path.
func TestDecodeFastAgreesWithTopics(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	valid := []topics.Hit{
		{Key: "k", Site: "s", BucketStart: 1, Window: 1, Count: 1},
		{Key: strings.Repeat("k", topics.MaxKeyLen), Site: strings.Repeat("s", topics.MaxSiteLen), BucketStart: -5, Window: 1 << 40, Count: 1 << 62},
		{Key: "api:POST /x|user=42", Site: "eu-1", BucketStart: 1763740000123, Window: 60000, Count: 3},
	}
	for _, h := range valid {
		b, err := h.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		var r hitRef
		if !decodeFast(b, &r) || string(r.key) != h.Key || string(r.site) != h.Site || r.bucketStart != h.BucketStart || r.window != h.Window || r.count != h.Count {
			t.Fatalf("fast path rejected or changed %+v: %+v", h, r)
		}
	}
	for i := range 200_000 {
		b, _ := valid[i%len(valid)].MarshalBinary()
		// Mutate: flip bytes, truncate, append.
		switch rng.IntN(3) {
		case 0:
			for range 1 + rng.IntN(3) {
				b[rng.IntN(len(b))] = byte(rng.IntN(256))
			}
		case 1:
			b = b[:rng.IntN(len(b))]
		case 2:
			b = append(b, byte(rng.IntN(256)))
		}
		var r hitRef
		if !decodeFast(b, &r) {
			continue
		}
		h, err := topics.DecodeHit(b)
		if err != nil {
			t.Fatalf("fast path accepted %x, DecodeHit: %v", b, err)
		}
		if string(r.key) != h.Key || string(r.site) != h.Site || r.bucketStart != h.BucketStart || r.window != h.Window || r.count != h.Count {
			t.Fatalf("%x: fast %+v, DecodeHit %+v", b, r, h)
		}
	}
}
