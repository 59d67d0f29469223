package topics

import (
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

const (
	testKeyEU = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
	testKeyUS = "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100"
)

// A record signed with its site's key verifies; the same value signed with another
// site's key, a changed value, no header and an unknown site are each refused with their
// own reason.
func TestSiteKeysVerify(t *testing.T) {
	k, err := ParseSiteKeys([]byte("# the sites\n\neu-1 " + testKeyEU + "\nus 1\t" + testKeyUS + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(k.Sites(), ","); got != "eu-1,us 1" {
		t.Fatalf("sites %q", got)
	}
	eu, _ := k.Key("eu-1")
	us, _ := k.Key("us 1")
	v, err := Hit{Key: SiteLeaveKey, Site: "us 1", BucketStart: 1, Instance: "i"}.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	if err := k.Verify([]byte("us 1"), v, SiteMAC(us, v)); err != nil {
		t.Fatalf("genuine record: %v", err)
	}
	changed := append([]byte(nil), v...)
	changed[len(changed)-1] ^= 1
	for _, c := range []struct {
		name       string
		site       string
		value, mac []byte
		want       error
		reason     string
	}{
		{"signed by another site", "us 1", v, SiteMAC(eu, v), ErrBadSignature, "bad_signature"},
		{"value changed", "us 1", changed, SiteMAC(us, v), ErrBadSignature, "bad_signature"},
		{"no header", "us 1", v, nil, ErrUnsigned, "unsigned"},
		{"empty header", "us 1", v, []byte{}, ErrBadSignature, "bad_signature"},
		{"unknown site", "ghost", v, SiteMAC(eu, v), ErrUnknownSite, "unknown_site"},
	} {
		err := k.Verify([]byte(c.site), c.value, c.mac)
		if !errors.Is(err, c.want) || Reason(err) != c.reason {
			t.Errorf("%s: %v (reason %s), want %v", c.name, err, Reason(err), c.want)
		}
	}
}

func TestParseSiteKeysRefuses(t *testing.T) {
	for name, text := range map[string]string{
		"empty":     "# nothing\n",
		"no key":    "eu-1\n",
		"not hex":   "eu-1 zz" + testKeyEU[2:] + "\n",
		"too short": "eu-1 0011223344\n",
		"twice":     "eu-1 " + testKeyEU + "\neu-1 " + testKeyUS + "\n",
	} {
		if _, err := ParseSiteKeys([]byte(text)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	dir := t.TempDir()
	p := filepath.Join(dir, "keys")
	if err := os.WriteFile(p, []byte("eu-1 "+testKeyEU+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	k, err := LoadSiteKeys(p)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := k.Key("eu-1"); !ok {
		t.Fatal("eu-1's key not loaded")
	}
	if _, err := LoadSiteKeys(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
}

// TestDocsSiteSignature checks docs/records.md's site signature section against the code:
// the header's name, the bound on site records, the keys file example (it parses) and the
// worked example (the heartbeat decodes, and its MAC under the example key is the one the
// page gives).
func TestDocsSiteSignature(t *testing.T) {
	b, err := os.ReadFile("../docs/records.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	_, sec, ok := strings.Cut(doc, "## Site signatures")
	if !ok {
		t.Fatal("docs/records.md has no section on site signatures")
	}
	sec, _, _ = strings.Cut(sec, "\n## ")
	for _, want := range []string{"`" + HeaderSiteMAC + "`", strings.TrimSuffix(siteMACContext, "\x00")} {
		if !strings.Contains(sec, want) {
			t.Errorf("the section does not name %q", want)
		}
	}
	if !strings.Contains(doc, "dated more than 1 s") || MaxSiteRecordAhead != time.Second {
		t.Errorf("docs/records.md does not give MaxSiteRecordAhead (%v) as 1 s", MaxSiteRecordAhead)
	}
	_, block, _ := strings.Cut(sec, "```text\n")
	block, _, _ = strings.Cut(block, "```")
	keys, err := ParseSiteKeys([]byte(block))
	if err != nil {
		t.Fatalf("the keys file example: %v", err)
	}
	key, ok := keys.Key("eu-1")
	if !ok {
		t.Fatal("the keys file example has no key for eu-1")
	}
	example := regexp.MustCompile("With that key, the site heartbeat\n`([^`]+)`\ncarries the header `streamlimit-site-mac` =\n`([0-9a-f]{64})`").FindStringSubmatch(sec)
	if example == nil {
		t.Fatal("no worked example of a signed heartbeat")
	}
	h, err := DecodeHit([]byte(example[1]))
	if err != nil || !h.IsSiteHeartbeat() || h.Site != "eu-1" {
		t.Fatalf("the example heartbeat: %+v, %v", h, err)
	}
	if got := hex.EncodeToString(SiteMAC(key, []byte(example[1]))); got != example[2] {
		t.Errorf("the example's MAC is %s, the page says %s", got, example[2])
	}
	if err := keys.Verify([]byte("eu-1"), []byte(example[1]), SiteMAC(key, []byte(example[1]))); err != nil {
		t.Error(err)
	}
}
