package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

func testFlags() (*pflag.FlagSet, *string, *time.Duration, *[]string) {
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	addr := fs.String("redis-addr", "", "")
	d := fs.Duration("timeout", time.Second, "")
	brokers := fs.StringSlice("brokers", []string{"localhost:9092"}, "")
	return fs, addr, d, brokers
}

func writeFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "streamlimit.yaml")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestSettingsPrecedence(t *testing.T) {
	fs, addr, d, brokers := testFlags()
	if err := fs.Parse([]string{"--timeout", "3s"}); err != nil {
		t.Fatal(err)
	}
	path := writeFile(t, "redis-addr: file:1\ntimeout: 9s\nbrokers: [a:1, b:2]\n")
	env := map[string]string{"STREAMLIMIT_REDIS_ADDR": "env:1"}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	if err := applySettings(fs, path, lookup); err != nil {
		t.Fatal(err)
	}
	if *d != 3*time.Second {
		t.Errorf("flag lost to file: timeout %v", *d)
	}
	if *addr != "env:1" {
		t.Errorf("env lost to file: %q", *addr)
	}
	if strings.Join(*brokers, ",") != "a:1,b:2" {
		t.Errorf("file list: %v", *brokers)
	}
	// The alias used by make test.
	fs, _, _, brokers = testFlags()
	env = map[string]string{"STREAMLIMIT_KAFKA_BROKERS": "k:9,k:10"}
	if err := applySettings(fs, "", lookup); err != nil {
		t.Fatal(err)
	}
	if strings.Join(*brokers, ",") != "k:9,k:10" {
		t.Errorf("alias: %v", *brokers)
	}
}

func TestSettingsErrorsNameLineAndReason(t *testing.T) {
	none := func(string) (string, bool) { return "", false }
	for body, want := range map[string]string{
		"redis-addr: x\nredis-adr: y\n": `:2: unknown setting "redis-adr"`,
		"timeout: soon\n":               `:1: timeout: invalid argument "soon"`,
		"- a\n":                         `:1: want a mapping`,
		"timeout: 1s\ntimeout: 2s\n":    `:2: setting "timeout" given twice`,
	} {
		fs, _, _, _ := testFlags()
		err := applySettings(fs, writeFile(t, body), none)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want it to contain %q", body, err, want)
		}
	}
	fs, _, _, _ := testFlags()
	err := applySettings(fs, "", func(k string) (string, bool) { return "forever", k == "STREAMLIMIT_TIMEOUT" })
	if err == nil || !strings.Contains(err.Error(), `STREAMLIMIT_TIMEOUT="forever"`) {
		t.Errorf("bad env value: %v", err)
	}
}
