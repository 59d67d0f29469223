package topics

import "testing"

var (
	benchHit   = Hit{Key: "api|route=POST /articles|user=4242#60000", Site: "eu-1", BucketStart: 1763740000100, Window: 60000, Count: 17}
	benchCount = Count{Key: "api|route=POST /articles|user=4242#60000", Window: 60000, AsOf: 1763740000123, Total: 118.5,
		Sites: []SiteCount{{Site: "ap", Count: 10}, {Site: "eu", Count: 70.5}, {Site: "us", Count: 38}}}
)

func BenchmarkHitEncode(b *testing.B) {
	buf := make([]byte, 0, 256)
	b.Run("binary", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			buf, _ = benchHit.AppendBinary(buf[:0])
		}
	})
	b.Run("json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			buf, _ = benchHit.AppendJSON(buf[:0])
		}
	})
}

func BenchmarkHitDecode(b *testing.B) {
	bin, _ := benchHit.MarshalBinary()
	js, _ := benchHit.MarshalJSON()
	b.Run("binary", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := DecodeHit(bin); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := DecodeHit(js); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkCountEncode(b *testing.B) {
	buf := make([]byte, 0, 256)
	b.Run("binary", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			buf, _ = benchCount.AppendBinary(buf[:0])
		}
	})
	b.Run("json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			buf, _ = benchCount.AppendJSON(buf[:0])
		}
	})
}

func BenchmarkCountDecode(b *testing.B) {
	bin, _ := benchCount.MarshalBinary()
	js, _ := benchCount.MarshalJSON()
	b.Run("binary", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := DecodeCount(bin); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := DecodeCount(js); err != nil {
				b.Fatal(err)
			}
		}
	})
}
