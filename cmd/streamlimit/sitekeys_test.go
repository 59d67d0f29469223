package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// --site-keys: the enforcer takes its --site's key from the file, and refuses a file
// without one, a file that does not parse and --no-kafka; the aggregator refuses a file
// that does not parse.
func TestSiteKeysFlag(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "eu.keys")
	bad := filepath.Join(dir, "bad.keys")
	if err := os.WriteFile(good, []byte("eu 00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, []byte("eu 0011\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ef := enforcerFlags{siteKeys: good, logFormat: "text", logLevel: "info", limitOverrides: "honour", compat: "none", unknownDomain: "allow"}
	ef.cfg.Site, ef.cfg.Rules = "eu", "r.yaml"
	cfg, err := ef.serverConfig()
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.SiteKey) != 32 || cfg.SiteKey[1] != 0x11 {
		t.Fatalf("site key %x, want eu's", cfg.SiteKey)
	}
	for _, c := range []struct {
		site, file string
		noKafka    bool
		want       string
	}{
		{"us", good, false, `no key for site "us"`},
		{"eu", bad, false, "at least 32"},
		{"eu", good, true, "not with --no-kafka"},
	} {
		ef := enforcerFlags{siteKeys: c.file, noKafka: c.noKafka, logFormat: "text", logLevel: "info", limitOverrides: "honour", compat: "none", unknownDomain: "allow"}
		ef.cfg.Site, ef.cfg.Rules = c.site, "r.yaml"
		if _, err := ef.serverConfig(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("site %s, file %s, no-kafka %v: %v, want %q", c.site, filepath.Base(c.file), c.noKafka, err, c.want)
		}
	}
	if _, err := run(t, "aggregator", "--brokers", "127.0.0.1:1", "--site-keys", bad); err == nil || !strings.Contains(err.Error(), "--site-keys") {
		t.Errorf("aggregator with a bad keys file: %v", err)
	}
}
