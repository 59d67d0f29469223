package topics

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"reflect"
	"strings"
	"testing"
)

func randString(r *rand.Rand, min, max int) string {
	n := min + r.IntN(max-min+1)
	var b strings.Builder
	for range n {
		switch r.IntN(10) {
		case 0:
			b.WriteByte(byte(r.IntN(0x20))) // control characters
		case 1:
			b.WriteString("é€😀\"\\") // multi-byte and characters JSON escapes
		default:
			b.WriteByte(byte('a' + r.IntN(26)))
		}
	}
	s := b.String()
	if len(s) > max {
		s = s[:max]
		for !isValidUTF8Prefix(s) {
			s = s[:len(s)-1]
		}
	}
	if len(s) < min {
		s += strings.Repeat("x", min-len(s))
	}
	return s
}

func isValidUTF8Prefix(s string) bool { return strings.ToValidUTF8(s, "\x00") == s }

func randHit(r *rand.Rand) Hit {
	return Hit{
		Key:         randString(r, 1, MaxKeyLen),
		Site:        randString(r, 1, MaxSiteLen),
		BucketStart: r.Int64N(1<<50) - 1<<40,
		Window:      1 + r.Int64N(1<<40),
		Count:       r.Int64N(1 << 62),
		Denied:      max(r.Int64N(1<<62)-1<<61, 0), // half the hits deny nothing (version 1)
	}
}

func fixCount(h Hit) Hit {
	if h.Count+h.Denied == 0 {
		h.Count = 1
	}
	return h
}

func randCount(r *rand.Rand) Count {
	c := Count{
		Key:    randString(r, 1, MaxKeyLen),
		Window: 1 + r.Int64N(1<<40),
		AsOf:   r.Int64N(1 << 50),
		Total:  r.Float64() * 1e9,
	}
	seen := map[string]bool{}
	for range r.IntN(6) {
		s := randString(r, 1, 20)
		if seen[s] {
			continue
		}
		seen[s] = true
		c.Sites = append(c.Sites, SiteCount{Site: s, Count: math.Floor(r.Float64() * 1e6), Demand: r.Float64() * float64(r.IntN(2))})
	}
	c.SubBuckets = r.IntN(MaxSubBuckets + 1)
	sortSites(c.Sites)
	return c
}

func sortSites(s []SiteCount) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j-1].Site > s[j].Site; j-- {
			s[j-1], s[j] = s[j], s[j-1]
		}
	}
}

// TestHitRoundTrip is the property test: for random valid hits, decode(encode(h)) == h in
// both encodings.
func TestHitRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 5000 {
		h := fixCount(randHit(r))
		if i%10 == 0 {
			h = Hit{Key: SiteHeartbeatKey, Site: h.Site, BucketStart: h.BucketStart}
			if i%20 == 0 {
				h.Instance, h.Counter = randString(r, 0, MaxSiteLen), randString(r, 0, MaxSiteLen)
			}
		}
		bin, err := h.MarshalBinary()
		if err != nil {
			t.Fatalf("#%d MarshalBinary(%+v): %v", i, h, err)
		}
		got, err := DecodeHit(bin)
		if err != nil || got != h {
			t.Fatalf("#%d binary round trip: got %+v, %v; want %+v", i, got, err, h)
		}
		js, err := h.MarshalJSON()
		if err != nil {
			t.Fatalf("#%d MarshalJSON: %v", i, err)
		}
		if !json.Valid(js) {
			t.Fatalf("#%d invalid JSON %q", i, js)
		}
		got, err = DecodeHit(js)
		if err != nil || got != h {
			t.Fatalf("#%d JSON round trip: got %+v, %v; want %+v (%s)", i, got, err, h, js)
		}
	}
}

func TestCountRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for i := range 3000 {
		c := randCount(r)
		bin, err := c.MarshalBinary()
		if err != nil {
			t.Fatalf("#%d MarshalBinary: %v", i, err)
		}
		got, err := DecodeCount(bin)
		if err != nil || !reflect.DeepEqual(got, c) {
			t.Fatalf("#%d binary round trip: got %+v, %v; want %+v", i, got, err, c)
		}
		js, err := c.MarshalJSON()
		if err != nil {
			t.Fatalf("#%d MarshalJSON: %v", i, err)
		}
		got, err = DecodeCount(js)
		if err != nil || !reflect.DeepEqual(got, c) {
			t.Fatalf("#%d JSON round trip: got %+v, %v; want %+v (%s)", i, got, err, c, js)
		}
	}
}

func TestHitJSONContractExample(t *testing.T) {
	// docs/records.md's example, as a kcat user would send it.
	h, err := DecodeHit([]byte(`{"key":"api:POST /articles|user=42","site":"eu-1","ts":1763740000123,"w":60000,"n":1}`))
	if err != nil {
		t.Fatal(err)
	}
	want := Hit{Key: "api:POST /articles|user=42", Site: "eu-1", BucketStart: 1763740000123, Window: 60000, Count: 1}
	if h != want {
		t.Fatalf("got %+v, want %+v", h, want)
	}
	// w and n are optional; n defaults to 1 and w to "the aggregator's default" (0).
	h, err = DecodeHit([]byte(` {"site":"us","key":"k","ts":5,"extra":[1,2]}` + "\n"))
	if err == nil {
		t.Fatalf("leading space: want unknown version error, got %+v", h)
	}
	h, err = DecodeHit([]byte(`{"site":"us","key":"k","ts":5,"extra":[1,2]}` + "\n"))
	if err != nil || h != (Hit{Key: "k", Site: "us", BucketStart: 5, Count: 1}) {
		t.Fatalf("got %+v, %v", h, err)
	}
	if _, err := h.MarshalBinary(); !errors.Is(err, ErrBadWindow) {
		t.Fatalf("binary encoding without window: got %v, want ErrBadWindow", err)
	}
}

func TestHitDecodeErrors(t *testing.T) {
	valid, _ := Hit{Key: "k", Site: "s", BucketStart: 1, Window: 1000, Count: 2}.MarshalBinary()
	long := strings.Repeat("k", MaxKeyLen+1)
	cases := []struct {
		name string
		in   []byte
		want error
	}{
		{"empty", nil, ErrTruncated},
		{"version only", []byte{1}, ErrTruncated},
		{"unknown version", []byte{9, 1, 1, 'k', 's'}, ErrUnknownVersion},
		{"cut short", valid[:len(valid)-1], ErrTruncated},
		{"trailing", append(append([]byte{}, valid...), 0), ErrTrailingBytes},
		{"empty key binary", mustHitBytes(t, 0, 1, "", "s", 1, 1000, 1), ErrEmptyKey},
		{"empty site binary", mustHitBytes(t, 1, 0, "k", "", 1, 1000, 1), ErrEmptySite},
		{"zero count binary", mustHitBytes(t, 1, 1, "k", "s", 1, 1000, 0), ErrBadCount},
		{"zero window binary", mustHitBytes(t, 1, 1, "k", "s", 1, 0, 1), ErrBadWindow},
		{"huge key length", []byte{1, 0xff, 0xff, 0x03, 1}, ErrKeyTooLong},
		{"varint overflow", []byte{1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}, ErrTruncated},
		{"json bad", []byte(`{"key":`), ErrBadJSON},
		{"json trailing", []byte(`{"key":"k","site":"s","ts":1} x`), ErrTrailingBytes},
		{"json two objects", []byte(`{"key":"k","site":"s","ts":1}{}`), ErrTrailingBytes},
		{"json no key", []byte(`{"site":"s","ts":1}`), ErrEmptyKey},
		{"json empty key", []byte(`{"key":"","site":"s","ts":1}`), ErrEmptyKey},
		{"json long key", []byte(`{"key":"` + long + `","site":"s","ts":1}`), ErrKeyTooLong},
		{"json reserved key", []byte(`{"key":"__streamlimit/x","site":"s","ts":1}`), ErrReservedKey},
		{"json no site", []byte(`{"key":"k","ts":1}`), ErrEmptySite},
		{"json no ts", []byte(`{"key":"k","site":"s"}`), ErrBadTime},
		{"json n 0", []byte(`{"key":"k","site":"s","ts":1,"n":0}`), ErrBadCount},
		{"json n negative", []byte(`{"key":"k","site":"s","ts":1,"n":-3}`), ErrBadCount},
		{"json w 0", []byte(`{"key":"k","site":"s","ts":1,"w":0}`), ErrBadWindow},
		{"json fractional n", []byte(`{"key":"k","site":"s","ts":1,"n":1.5}`), ErrBadJSON},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h, err := DecodeHit(c.in)
			if !errors.Is(err, c.want) {
				t.Fatalf("DecodeHit(%q) = %+v, %v; want %v", c.in, h, err, c.want)
			}
			if Reason(err) == "other" {
				t.Fatalf("Reason(%v) = other", err)
			}
		})
	}
}

// mustHitBytes builds a binary hit by hand, bypassing validation, to test the decoder.
func mustHitBytes(t *testing.T, kl, sl int, k, s string, ts, w, n int64) []byte {
	t.Helper()
	b := []byte{hitVersion1, byte(kl), byte(sl)}
	b = append(b, k...)
	b = append(b, s...)
	b = appendVarint(b, ts)
	b = appendUvarint(b, uint64(w))
	return appendUvarint(b, uint64(n))
}

func TestCountDecodeErrors(t *testing.T) {
	good := Count{Key: "k", Window: 60000, AsOf: 5, Total: 3, Sites: []SiteCount{{Site: "a", Count: 1}, {Site: "b", Count: 2}}}
	valid, _ := good.MarshalBinary()
	unsorted := good
	unsorted.Sites = []SiteCount{{Site: "b", Count: 2}, {Site: "a", Count: 1}}
	cases := []struct {
		name string
		in   []byte
		want error
	}{
		{"empty", nil, ErrTruncated},
		{"unknown version", []byte{7}, ErrUnknownVersion},
		{"cut", valid[:len(valid)-3], ErrTruncated},
		{"trailing", append(append([]byte{}, valid...), 1), ErrTrailingBytes},
		{"too many sites", []byte{1, 1, 'k', 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0x03}, ErrTruncated},
		{"json missing w", []byte(`{"key":"k","asof":1,"total":1}`), ErrBadWindow},
		{"json negative total", []byte(`{"key":"k","w":1,"asof":1,"total":-1}`), ErrBadCount},
		{"json empty site", []byte(`{"key":"k","w":1,"asof":1,"total":1,"sites":{"":1}}`), ErrEmptySite},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got, err := DecodeCount(c.in); !errors.Is(err, c.want) {
				t.Fatalf("DecodeCount(%q) = %+v, %v; want %v", c.in, got, err, c.want)
			}
		})
	}
	if _, err := unsorted.MarshalBinary(); !errors.Is(err, ErrBadSites) {
		t.Fatalf("unsorted sites: got %v, want ErrBadSites", err)
	}
	if got := good.Site("b"); got != 2 {
		t.Fatalf("Site(b) = %v", got)
	}
	if got := good.Site("zz"); got != 0 {
		t.Fatalf("Site(zz) = %v", got)
	}
}

func TestHeartbeat(t *testing.T) {
	hb := Heartbeat{Instance: "agg-1", Topic: "us.hits", Partition: 3, AsOf: 17, Offset: 100, HighWatermark: 120}
	b, err := hb.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeHeartbeat(b)
	if err != nil || !reflect.DeepEqual(got, hb) {
		t.Fatalf("got %+v, %v", got, err)
	}
	key := HeartbeatKey("us.hits", 3)
	if key != "__streamlimit/hb/us.hits/3" || !IsHeartbeatKey([]byte(key)) || !IsReservedKey([]byte(key)) {
		t.Fatalf("HeartbeatKey = %q", key)
	}
	if IsReservedKey([]byte("api|user=1")) {
		t.Fatal("ordinary key reported reserved")
	}
	if _, err := DecodeHeartbeat([]byte{1, 2}); err == nil {
		t.Fatal("binary garbage decoded as heartbeat")
	}
}

func TestNames(t *testing.T) {
	if got := RemoteHitsTopic("us", "hits"); got != "us.hits" {
		t.Fatalf("RemoteHitsTopic = %q", got)
	}
	re := HitsPattern("hits")
	for topic, want := range map[string]bool{"hits": true, "us.hits": true, "eu-1.hits": true, "hits2": false, "us.hits.x": false, "counts": false, "a.b.hits": false} {
		if got := regexpMatch(t, re, topic); got != want {
			t.Errorf("%s matches %q = %v, want %v", re, topic, got, want)
		}
	}
	if SiteOfTopic("us.hits", "hits") != "us" || SiteOfTopic("hits", "hits") != "" {
		t.Fatal("SiteOfTopic wrong")
	}
}

func TestConfigNormalize(t *testing.T) {
	c, err := Config{}.Normalize()
	if err != nil {
		t.Fatal(err)
	}
	if c.HitsTopic != "hits" || c.CountsTopic != "counts" || c.HitsPartitions != 12 || c.HitsRetention.Hours() != 24 {
		t.Fatalf("defaults: %+v", c)
	}
	if *c.CountsConfigs()["cleanup.policy"] != "compact" || *c.HitsConfigs()["retention.ms"] != "86400000" {
		t.Fatal("configs wrong")
	}
	if _, err := (Config{MaxWindow: 13 * 3600e9}).Normalize(); err == nil || !strings.Contains(err.Error(), "twice the longest window") {
		t.Fatalf("retention < 2×window accepted: %v", err)
	}
	if _, err := (Config{HitsTopic: "x", CountsTopic: "x"}).Normalize(); err == nil {
		t.Fatal("same topic names accepted")
	}
}

func TestAppendJSONStringEscapes(t *testing.T) {
	for _, s := range []string{"plain", "q\"b\\", "\x00\x1f\n\t\r", "é€😀", "bad\xff\xfeutf8", "\u2028\u2029", "<html>&"} {
		got := appendJSONString(nil, s)
		var back string
		if err := json.Unmarshal(got, &back); err != nil {
			t.Fatalf("%q → %s: %v", s, got, err)
		}
		var want string
		std, _ := json.Marshal(s)
		_ = json.Unmarshal(std, &want)
		if back != want {
			t.Fatalf("%q → %s → %q", s, got, back)
		}
	}
	if !bytes.Equal(appendJSONString(nil, "a\"b"), []byte(`"a\"b"`)) {
		t.Fatal("quote escaping")
	}
}

// TestInvalidUTF8Rejected: keys and sites travel as JSON strings too, so bytes that are not
// UTF-8 are rejected in both encodings (found by FuzzDecodeHit: such a binary hit could
// not be re-encoded as JSON within the limits).
func TestInvalidUTF8Rejected(t *testing.T) {
	for _, h := range []Hit{
		{Key: "k\xca", Site: "s", BucketStart: 1, Window: 1000, Count: 1},
		{Key: "k", Site: "\xff", BucketStart: 1, Window: 1000, Count: 1},
	} {
		if _, err := h.MarshalBinary(); !errors.Is(err, ErrBadUTF8) {
			t.Errorf("MarshalBinary(%q, %q): %v, want ErrBadUTF8", h.Key, h.Site, err)
		}
		b := mustHitBytes(t, len(h.Key), len(h.Site), h.Key, h.Site, 1, 1000, 1)
		if _, err := DecodeHit(b); !errors.Is(err, ErrBadUTF8) || Reason(err) != "bad_utf8" {
			t.Errorf("DecodeHit(%q): %v, want ErrBadUTF8", b, err)
		}
	}
	c := Count{Key: "k\xca", Window: 1, Total: 1}
	if _, err := c.MarshalBinary(); !errors.Is(err, ErrBadUTF8) {
		t.Errorf("Count with invalid key: %v", err)
	}
}

// TestHitVersions pins the version byte: a hit that denies nothing is written as version 1,
// which every aggregator reads; denials and site heartbeats need version 2.
func TestHitVersions(t *testing.T) {
	for _, c := range []struct {
		h    Hit
		want byte
	}{
		{Hit{Key: "k", Site: "eu", BucketStart: 1, Window: 1000, Count: 3}, hitVersion1},
		{Hit{Key: "k", Site: "eu", BucketStart: 1, Window: 1000, Count: 3, Denied: 2}, hitVersion2},
		{Hit{Key: "k", Site: "eu", BucketStart: 1, Window: 1000, Denied: 2}, hitVersion2},
		{Hit{Key: SiteHeartbeatKey, Site: "eu", BucketStart: 1}, hitVersion2},
	} {
		b, err := c.h.MarshalBinary()
		if err != nil || b[0] != c.want {
			t.Fatalf("%+v: version %d, %v; want %d", c.h, b[0], err, c.want)
		}
	}
	// A version 1 record cannot say "nothing admitted".
	if _, err := DecodeHit(mustHitBytes(t, 1, 2, "k", "eu", 1, 1000, 0)); !errors.Is(err, ErrBadCount) {
		t.Fatalf("v1 with count 0: %v", err)
	}
}

func TestHitDeniedAndSiteHeartbeatJSON(t *testing.T) {
	for in, want := range map[string]Hit{
		`{"key":"k","site":"eu","ts":5,"w":1000,"n":2,"d":7}`:                                     {Key: "k", Site: "eu", BucketStart: 5, Window: 1000, Count: 2, Denied: 7},
		`{"key":"k","site":"eu","ts":5,"w":1000,"d":7}`:                                           {Key: "k", Site: "eu", BucketStart: 5, Window: 1000, Denied: 7},
		`{"key":"k","site":"eu","ts":5}`:                                                          {Key: "k", Site: "eu", BucketStart: 5, Count: 1},
		`{"key":"__streamlimit/alive","site":"eu","ts":5}`:                                        {Key: SiteHeartbeatKey, Site: "eu", BucketStart: 5},
		`{"key":"__streamlimit/alive","site":"eu","ts":5,"instance":"i1","counter":"process:i1"}`: {Key: SiteHeartbeatKey, Site: "eu", BucketStart: 5, Instance: "i1", Counter: "process:i1"},
	} {
		got, err := DecodeHit([]byte(in))
		if err != nil || got != want {
			t.Errorf("DecodeHit(%s) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for in, wantErr := range map[string]error{
		`{"key":"k","site":"eu","ts":5,"n":0}`:                   ErrBadCount,
		`{"key":"k","site":"eu","ts":5,"n":1,"d":-1}`:            ErrBadCount,
		`{"key":"__streamlimit/alive","site":"eu","ts":5,"n":1}`: ErrBadCount,
		`{"key":"__streamlimit/alive","ts":5}`:                   ErrEmptySite,
		`{"key":"__streamlimit/other","site":"eu","ts":5}`:       ErrReservedKey,
	} {
		if got, err := DecodeHit([]byte(in)); !errors.Is(err, wantErr) {
			t.Errorf("DecodeHit(%s) = %+v, %v; want %v", in, got, err, wantErr)
		}
	}
	if !(Hit{Key: SiteHeartbeatKey}).IsSiteHeartbeat() || (Hit{Key: "k"}).IsSiteHeartbeat() {
		t.Fatal("IsSiteHeartbeat")
	}
}

// TestCountVersion1 decodes a version 1 count, as older aggregators wrote it: no sub-bucket
// count, no demand.
func TestCountVersion1(t *testing.T) {
	b := []byte{countVersion1, 1, 'k'}
	b = appendUvarint(b, 60000)
	b = appendVarint(b, 5)
	b = append(b, 0, 0, 0, 0, 0, 0, 0x08, 0x40) // 3.0
	b = appendUvarint(b, 1)
	b = append(b, 2, 'e', 'u')
	b = append(b, 0, 0, 0, 0, 0, 0, 0x08, 0x40)
	got, err := DecodeCount(b)
	want := Count{Key: "k", Window: 60000, AsOf: 5, Total: 3, Sites: []SiteCount{{Site: "eu", Count: 3}}}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v, %v; want %+v", got, err, want)
	}
	js := []byte(`{"key":"k","w":60000,"asof":5,"total":3,"sub":60,"sites":{"eu":3},"demand":{"us":1}}`)
	if _, err := DecodeCount(js); !errors.Is(err, ErrBadSites) {
		t.Fatalf("demand of a site without a count: %v", err)
	}
}

func TestHeartbeatSites(t *testing.T) {
	hb := Heartbeat{Instance: "a", Topic: "hits", Partition: 1, AsOf: 9, Sites: map[string]int64{"eu": 7, "us": 3}}
	b, err := hb.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeHeartbeat(b)
	if err != nil || !reflect.DeepEqual(got, hb) {
		t.Fatalf("got %+v, %v (%s)", got, err, b)
	}
}

// TestDocsRecordExamples decodes every JSON record example of docs/records.md (its ```json
// blocks): a hit, a site heartbeat, a lag report or a count, each must decode as the record
// it shows, so that the page cannot drift from the codecs.
func TestDocsRecordExamples(t *testing.T) {
	b, err := os.ReadFile("../docs/records.md")
	if err != nil {
		t.Fatal(err)
	}
	records := string(b)
	n := 0
	for _, block := range strings.Split(records, "```json\n")[1:] {
		body, _, _ := strings.Cut(block, "```")
		body = strings.TrimSpace(body)
		n++
		switch {
		case strings.Contains(body, `"local"`):
			r, err := DecodeLagReport([]byte(body))
			if err != nil || len(r.Local) == 0 || len(r.Remote) == 0 || r.Instance == "" {
				t.Errorf("docs/records.md lag report example %q: %+v, %v", body, r, err)
			}
		case strings.Contains(body, `"asof"`):
			c, err := DecodeCount([]byte(body))
			if err != nil || c.SubBuckets == 0 || len(c.Sites) == 0 || c.Sites[0].Demand == 0 {
				t.Errorf("docs/records.md count example %q: %+v, %v", body, c, err)
			}
		default:
			h, err := DecodeHit([]byte(body))
			if err != nil {
				t.Errorf("docs/records.md hit example %q: %v", body, err)
			}
			if strings.Contains(body, SiteHeartbeatKey) != h.IsSiteHeartbeat() || (h.IsSiteHeartbeat() && (h.Instance == "" || h.Counter == "")) {
				t.Errorf("docs/records.md example %q decoded as %+v", body, h)
			}
		}
	}
	if n != 4 {
		t.Fatalf("found %d JSON record examples in docs/records.md, want 4 (hit, site heartbeat, lag report, count)", n)
	}
}

// TestDocsHitBatch checks docs/records.md's description of a hit batch against the
// codec: its record key and version byte, and a batch laid out as the page says (site,
// then each hit's key, bucket start, window, admitted and refused) reads back.
func TestDocsHitBatch(t *testing.T) {
	b, err := os.ReadFile("../docs/records.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	if !strings.Contains(doc, "record key `"+HitBatchKey+"`), version 3: byte `0x03`") {
		t.Errorf("docs/records.md does not give the hit batch's key %s and version byte 0x03", HitBatchKey)
	}
	// By hand, as the page describes it: 0x03, site "eu", then one hit.
	v := []byte{0x03, 2, 'e', 'u', 3, 'k', '/', '1'}
	v = binary.AppendVarint(v, 1763740000000)
	v = binary.AppendUvarint(v, 60000)
	v = binary.AppendUvarint(v, 4)
	v = binary.AppendUvarint(v, 1)
	batch, err := ReadHitBatch(v)
	if err != nil {
		t.Fatal(err)
	}
	var h BatchHit
	if !batch.Next(&h) || string(batch.Site) != "eu" || string(h.Key) != "k/1" || h.BucketStart != 1763740000000 || h.Window != 60000 || h.Count != 4 || h.Denied != 1 {
		t.Errorf("the page's batch read as site %q, %+v", batch.Site, h)
	}
}
