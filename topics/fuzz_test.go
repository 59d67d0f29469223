package topics

import (
	"errors"
	"reflect"
	"testing"
)

// FuzzDecodeHit checks that DecodeHit never panics, that every error it returns has a
// Reason, and that whatever it accepts re-encodes to something that decodes to the same hit.
// The seed corpus is in testdata/fuzz/FuzzDecodeHit as well as below.
func FuzzDecodeHit(f *testing.F) {
	for _, h := range []Hit{
		{Key: "api|user=42#60s", Site: "eu-1", BucketStart: 1763740000100, Window: 60000, Count: 3},
		{Key: "k", Site: "s", BucketStart: -5, Window: 1, Count: 1 << 40},
	} {
		b, _ := h.MarshalBinary()
		f.Add(b)
		j, _ := h.MarshalJSON()
		f.Add(j)
	}
	f.Add([]byte(`{"key":"api:POST /articles|user=42","site":"eu-1","ts":1763740000123,"w":60000,"n":1}`))
	f.Add([]byte(`{"key":"k","site":"s","ts":1}`))
	f.Add([]byte{1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := DecodeHit(b)
		if err != nil {
			if Reason(err) == "other" {
				t.Fatalf("error without reason: %v", err)
			}
			return
		}
		if err := h.Validate(); err != nil {
			t.Fatalf("decoded invalid hit %+v: %v", h, err)
		}
		j, err := h.MarshalJSON()
		if err != nil {
			t.Fatalf("re-encode JSON: %v", err)
		}
		back, err := DecodeHit(j)
		if err != nil {
			t.Fatalf("decode re-encoded JSON %s: %v", j, err)
		}
		if validUTF8(h.Key) && validUTF8(h.Site) && back != h {
			t.Fatalf("JSON round trip: %+v → %+v", h, back)
		}
		if h.Window > 0 {
			bin, err := h.MarshalBinary()
			if err != nil {
				t.Fatalf("re-encode binary: %v", err)
			}
			if back, err := DecodeHit(bin); err != nil || back != h {
				t.Fatalf("binary round trip: %+v → %+v, %v", h, back, err)
			}
		}
	})
}

// FuzzDecodeCount is FuzzDecodeHit for count records.
func FuzzDecodeCount(f *testing.F) {
	c := Count{Key: "api|user=42#60s", Window: 60000, AsOf: 1763740000123, Total: 6.5, Sites: []SiteCount{{Site: "eu", Count: 3.5}, {Site: "us", Count: 3}}}
	b, _ := c.MarshalBinary()
	f.Add(b)
	j, _ := c.MarshalJSON()
	f.Add(j)
	f.Add([]byte(`{"key":"k","w":1,"asof":1,"total":0}`))
	f.Add([]byte{1, 1, 'k', 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0x03})
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := DecodeCount(b)
		if err != nil {
			if Reason(err) == "other" {
				t.Fatalf("error without reason: %v", err)
			}
			return
		}
		bin, err := c.MarshalBinary()
		if err != nil {
			t.Fatalf("decoded count does not re-encode: %+v: %v", c, err)
		}
		back, err := DecodeCount(bin)
		if err != nil || !reflect.DeepEqual(back, c) {
			t.Fatalf("binary round trip: %+v → %+v, %v", c, back, err)
		}
		if _, err := c.MarshalJSON(); err != nil && !errors.Is(err, ErrBadSites) {
			t.Fatalf("re-encode JSON: %v", err)
		}
	})
}

func validUTF8(s string) bool {
	for _, r := range s {
		if r == '\uFFFD' {
			return false
		}
	}
	return true
}
