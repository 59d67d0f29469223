package topics

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func batchOf(t testing.TB, site string, hits ...Hit) []byte {
	t.Helper()
	b, err := AppendHitBatch(nil, site)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hits {
		if b, err = h.AppendToBatch(b); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

// A hit batch holds the hits written into it, each of the batch's site, in order; one hit
// record decodes through DecodeHits as itself.
func TestHitBatchRoundTrip(t *testing.T) {
	hits := []Hit{
		{Key: "api|user=42#60s", Site: "eu-1", BucketStart: 1763740000100, Window: 60000, Count: 3},
		{Key: "k", Site: "eu-1", BucketStart: -5, Window: 1, Count: 1 << 40, Denied: 7},
		{Key: "héllo", Site: "eu-1", BucketStart: 1763740000200, Window: 1000, Denied: 1},
	}
	v := batchOf(t, "eu-1", hits...)
	if !IsHitBatch(v) {
		t.Fatal("IsHitBatch = false")
	}
	got, err := DecodeHits(v)
	if err != nil || !reflect.DeepEqual(got, hits) {
		t.Fatalf("DecodeHits = %+v, %v; want %+v", got, err, hits)
	}
	b, err := ReadHitBatch(v)
	if err != nil || string(b.Site) != "eu-1" || b.Len != 3 {
		t.Fatalf("ReadHitBatch: site %q, %d hits, %v", b.Site, b.Len, err)
	}
	single, _ := hits[0].MarshalBinary()
	if got, err := DecodeHits(single); err != nil || len(got) != 1 || got[0] != hits[0] {
		t.Fatalf("DecodeHits of one hit = %+v, %v", got, err)
	}
	if _, err := DecodeHit(v); !errors.Is(err, ErrUnknownVersion) || !strings.Contains(err.Error(), "DecodeHits") {
		t.Fatalf("DecodeHit of a batch: %v", err)
	}
}

// Every malformed batch is refused whole, with the reason of its first fault; nothing is
// written for an invalid hit or site.
func TestHitBatchRejects(t *testing.T) {
	good := Hit{Key: "k", BucketStart: 1, Window: 1000, Count: 1}
	start, _ := AppendHitBatch(nil, "eu")
	for _, c := range []struct {
		name  string
		value []byte
		want  error
	}{
		{"empty", nil, ErrTruncated},
		{"one hit record", func() []byte { h := good; h.Site = "eu"; b, _ := h.MarshalBinary(); return b }(), ErrUnknownVersion},
		{"no hits", start, ErrTruncated},
		{"empty site", append([]byte{3, 0}, batchOf(t, "eu", good)[4:]...), ErrEmptySite},
		{"site not UTF-8", append([]byte{3, 1, 0xff}, batchOf(t, "e", good)[3:]...), ErrBadUTF8},
		{"long site", append(append([]byte{3, 129, 1}, strings.Repeat("s", 129)...), batchOf(t, "e", good)[3:]...), ErrSiteTooLong},
		{"cut short", batchOf(t, "eu", good, good)[:12], ErrTruncated},
		{"empty key", append(append([]byte{}, start...), 0, 2, 1, 1, 0), ErrEmptyKey},
		{"reserved key", append(append(append([]byte{}, start...), 16), []byte(ReservedPrefix+"xy\x02\x01\x01\x00")...), ErrReservedKey},
		{"key not UTF-8", append(append([]byte{}, start...), 1, 0xff, 2, 1, 1, 0), ErrBadUTF8},
		{"no window", append(append([]byte{}, start...), 1, 'k', 2, 0, 1, 0), ErrBadWindow},
		{"no count", append(append([]byte{}, start...), 1, 'k', 2, 1, 0, 0), ErrBadCount},
	} {
		if _, err := ReadHitBatch(c.value); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
		if _, err := DecodeHits(c.value); c.name != "one hit record" && !errors.Is(err, c.want) {
			t.Errorf("%s: DecodeHits %v, want %v", c.name, err, c.want)
		}
		dst := make([]BatchHit, 1, 8)
		if site, hits, err := AppendBatchHits(dst, c.value); !errors.Is(err, c.want) || site != nil || len(hits) != 1 || hits[1:2][0].Key != nil {
			t.Errorf("%s: AppendBatchHits %q, %d hits, %v; want dst back and %v", c.name, site, len(hits), err, c.want)
		}
	}
	for _, h := range []Hit{
		{Key: "", BucketStart: 1, Window: 1, Count: 1},
		{Key: "k", BucketStart: 1, Window: 0, Count: 1},
		{Key: "k", BucketStart: 1, Window: 1},
		{Key: SiteHeartbeatKey, Site: "eu", BucketStart: 1},
	} {
		if b, err := h.AppendToBatch(start); err == nil || len(b) != len(start) {
			t.Errorf("AppendToBatch(%+v) = %d bytes, %v", h, len(b), err)
		}
	}
	if b, err := AppendHitBatch(nil, ""); err == nil || len(b) != 0 {
		t.Errorf("AppendHitBatch with no site: %v", err)
	}
}

// Appending a hit to a batch with room, and reading it back, allocate nothing.
func TestHitBatchNoAllocation(t *testing.T) {
	h := Hit{Key: "api|user=42#60s", BucketStart: 1763740000100, Window: 60000, Count: 3}
	buf := make([]byte, 0, 256)
	start, _ := AppendHitBatch(buf, "eu-1")
	v, _ := h.AppendToBatch(start)
	if a := testing.AllocsPerRun(100, func() { _, _ = h.AppendToBatch(start) }); a != 0 {
		t.Errorf("AppendToBatch allocates %v times", a)
	}
	var bh BatchHit
	if a := testing.AllocsPerRun(100, func() {
		b, _ := ReadHitBatch(v)
		for b.Next(&bh) {
		}
	}); a != 0 {
		t.Errorf("reading a batch allocates %v times", a)
	}
	dst := make([]BatchHit, 0, 4)
	if a := testing.AllocsPerRun(100, func() { _, dst, _ = AppendBatchHits(dst[:0], v) }); a != 0 {
		t.Errorf("AppendBatchHits into room allocates %v times", a)
	}
}

// FuzzHitBatch checks that ReadHitBatch never panics, that every error it returns has a
// Reason, that every hit of a batch it accepts is a valid hit that re-encodes to the
// same hit, and that AppendBatchHits accepts and refuses what it does, with the same hits
// and errors.
func FuzzHitBatch(f *testing.F) {
	f.Add(batchOf(f, "eu-1", Hit{Key: "api|user=42#60s", BucketStart: 1763740000100, Window: 60000, Count: 3},
		Hit{Key: "k", BucketStart: -5, Window: 1, Denied: 2}))
	f.Add([]byte{3, 1, 's', 1, 'k', 2, 1, 1, 0})
	f.Fuzz(func(t *testing.T, v []byte) {
		hits, err := DecodeHits(v)
		if IsHitBatch(v) || len(v) == 0 {
			checkAppendBatchHits(t, v, hits, err)
		}
		if err != nil {
			if Reason(err) == "other" {
				t.Fatalf("error without reason: %v", err)
			}
			return
		}
		if !IsHitBatch(v) {
			return
		}
		b, _ := ReadHitBatch(v)
		if len(hits) != b.Len || len(hits) == 0 {
			t.Fatalf("%d hits, Len %d", len(hits), b.Len)
		}
		re, err := AppendHitBatch(nil, hits[0].Site)
		if err != nil {
			t.Fatal(err)
		}
		for _, h := range hits {
			if err := h.Validate(); err != nil || h.Site != hits[0].Site {
				t.Fatalf("decoded invalid hit %+v: %v", h, err)
			}
			if re, err = h.AppendToBatch(re); err != nil {
				t.Fatalf("re-encode %+v: %v", h, err)
			}
		}
		back, err := DecodeHits(re)
		if err != nil || !reflect.DeepEqual(back, hits) {
			t.Fatalf("round trip: %+v → %+v, %v", hits, back, err)
		}
	})
}

// checkAppendBatchHits checks that AppendBatchHits reads batch v as DecodeHits did: hits, or
// the error err.
func checkAppendBatchHits(t *testing.T, v []byte, hits []Hit, err error) {
	t.Helper()
	prev := BatchHit{Key: []byte("before"), Window: 1, Count: 1}
	site, got, gerr := AppendBatchHits([]BatchHit{prev}, v)
	if err != nil {
		if gerr == nil || gerr.Error() != err.Error() || len(got) != 1 || site != nil {
			t.Fatalf("AppendBatchHits: %q, %d hits, %v; DecodeHits %v", site, len(got), gerr, err)
		}
		return
	}
	if gerr != nil || len(got) != len(hits)+1 || string(got[0].Key) != "before" {
		t.Fatalf("AppendBatchHits: %d hits, %v; DecodeHits %d hits", len(got), gerr, len(hits))
	}
	for i, h := range got[1:] {
		if back := (Hit{Key: string(h.Key), Site: string(site), BucketStart: h.BucketStart, Window: h.Window, Count: h.Count, Denied: h.Denied}); back != hits[i] {
			t.Fatalf("AppendBatchHits hit %d = %+v, DecodeHits %+v", i, back, hits[i])
		}
	}
}
