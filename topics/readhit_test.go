package topics_test

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/streamlimit/streamlimit/topics"
)

// Every record ReadHit accepts, DecodeHit accepts with the same values, and every valid
// binary hit of version 1 is read by ReadHit.
func TestReadHitAgreesWithDecodeHit(t *testing.T) {
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
		var r topics.BatchHit
		site, ok := topics.ReadHit(b, &r)
		if !ok || string(r.Key) != h.Key || string(site) != h.Site || r.BucketStart != h.BucketStart || r.Window != h.Window || r.Count != h.Count || r.Denied != 0 {
			t.Fatalf("ReadHit rejected or changed %+v: %+v", h, r)
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
		var r topics.BatchHit
		site, ok := topics.ReadHit(b, &r)
		if !ok {
			continue
		}
		h, err := topics.DecodeHit(b)
		if err != nil {
			t.Fatalf("ReadHit accepted %x, DecodeHit: %v", b, err)
		}
		if string(r.Key) != h.Key || string(site) != h.Site || r.BucketStart != h.BucketStart || r.Window != h.Window || r.Count != h.Count || h.Denied != 0 {
			t.Fatalf("%x: ReadHit %+v, DecodeHit %+v", b, r, h)
		}
	}
}

// ReadHit reads a valid record without allocating.
func TestReadHitNoAllocation(t *testing.T) {
	b, err := topics.Hit{Key: "api|user=42#60s", Site: "eu-1", BucketStart: 1763740000000, Window: 60000, Count: 2}.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	var h topics.BatchHit
	if n := testing.AllocsPerRun(100, func() {
		if _, ok := topics.ReadHit(b, &h); !ok {
			t.Fatal("not read")
		}
	}); n != 0 {
		t.Fatalf("%v allocations per ReadHit", n)
	}
}
