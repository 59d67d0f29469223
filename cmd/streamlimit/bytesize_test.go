package main

import (
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

// --max-memory takes whole numbers of bytes with binary units, or none; anything else is
// refused with what is accepted, in a --config file with its line.
func TestByteSizeFlag(t *testing.T) {
	for in, want := range map[string]int64{
		"256MiB": 256 << 20, "2GiB": 2 << 30, "1073741824": 1 << 30, "64 KiB": 64 << 10, "10B": 10, "none": -1,
	} {
		var b byteSize
		if err := b.Set(in); err != nil || int64(b) != want {
			t.Errorf("Set(%q) = %d, %v; want %d", in, b, err, want)
		}
	}
	for _, in := range []string{"", "0", "-1GiB", "1.5GiB", "2GB", "lots", "99999999TiB"} {
		var b byteSize
		if err := b.Set(in); err == nil {
			t.Errorf("Set(%q) accepted: %d", in, b)
		}
	}
	for v, want := range map[int64]string{2 << 30: "2GiB", 256 << 20: "256MiB", 1000: "1000B", -1: "none"} {
		b := byteSize(v)
		if got := b.String(); got != want {
			t.Errorf("String(%d) = %q, want %q", v, got, want)
		}
	}
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	var b byteSize
	fs.Var(&b, "max-memory", "")
	err := applySettings(fs, writeFile(t, "max-memory: 2 gigs\n"), func(string) (string, bool) { return "", false })
	if err == nil || !strings.Contains(err.Error(), ":1: max-memory:") || !strings.Contains(err.Error(), "KiB, MiB, GiB") {
		t.Errorf("bad --max-memory in a file: %v", err)
	}
}
