//go:build unix

package safefile

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/streamlimit/streamlimit/internal/safefile/safefiletest"
)

// Read refuses, without blocking or reading, what os.ReadFile would hang or run out of
// memory on: a FIFO without a writer, a device, a directory, a file over the bound.
func TestReadRefuses(t *testing.T) {
	dir := t.TempDir()
	fifo, big := safefiletest.Hostile(t, dir, "")
	zero := filepath.Join(dir, "zero")
	if err := os.Symlink("/dev/zero", zero); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		path, want string
		is         error
	}{
		{fifo, "not a regular file (named pipe)", ErrNotRegular},
		{zero, "not a regular file (character device)", ErrNotRegular},
		{dir, "not a regular file (directory)", ErrNotRegular},
		{big, "286.1MiB exceeds the limit of 16MiB", ErrTooLarge},
	} {
		_, _, err := Read(c.path, 16<<20)
		if !errors.Is(err, c.is) || err.Error() != c.want {
			t.Errorf("Read(%s) = %v, want %q", filepath.Base(c.path), err, c.want)
		}
	}
	good := filepath.Join(dir, "good")
	if err := os.WriteFile(good, []byte("0123456789"), 0o600); err != nil {
		t.Fatal(err)
	}
	if b, fi, err := Read(good, 10); err != nil || string(b) != "0123456789" || fi.Size() != 10 {
		t.Fatalf("Read(good, 10) = %q, %v", b, err)
	}
	if _, _, err := Read(good, 9); !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "10 bytes exceeds the limit of 9 bytes") {
		t.Fatalf("Read(good, 9) = %v", err)
	}
	if _, _, err := Read(filepath.Join(dir, "missing"), 10); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
}

func TestSize(t *testing.T) {
	for n, want := range map[int64]string{0: "0 bytes", 1023: "1023 bytes", 1024: "1KiB", 16 << 20: "16MiB", 300e6: "286.1MiB", 3 << 30: "3GiB"} {
		if got := Size(n); got != want {
			t.Errorf("Size(%d) = %q, want %q", n, got, want)
		}
	}
}
