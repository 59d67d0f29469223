//go:build unix

package rules

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/streamlimit/streamlimit/internal/safefile"
)

const goodRules = "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5}\n"

// mkfifo makes a named pipe at path, which nothing ever writes.
func mkfifo(t *testing.T, path string) {
	t.Helper()
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
}

// sparse makes a file of size bytes that takes no disk.
func sparse(t *testing.T, path string, size int64) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(f.Truncate(size), f.Close()); err != nil {
		t.Fatal(err)
	}
}

// noHang fails the test when f has not returned in 10 s (a FIFO's open blocks for ever).
func noHang[T any](t *testing.T, what string, f func() T) T {
	t.Helper()
	done := make(chan T, 1)
	go func() { done <- f() }()
	select {
	case v := <-done:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: still blocked after 10s", what)
		panic("unreachable")
	}
}

// Every way of loading rules (a file, a directory, LoadWith as the enforcer and
// `rules check` load) refuses a path that is not a regular file, and a file over the size
// bound, with a clear error, without blocking or reading it.
func TestLoadRefusesWhatIsNotARulesFile(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo.yaml")
	mkfifo(t, fifo)
	big := filepath.Join(dir, "big.yaml")
	sparse(t, big, 300e6)
	zero := filepath.Join(dir, "zero.yaml")
	if err := os.Symlink("/dev/zero", zero); err != nil {
		t.Fatal(err)
	}
	type load struct {
		name string
		f    func(string) (*Config, error)
	}
	loads := []load{
		{"LoadFile", LoadFile},
		{"Load", Load},
		{"LoadWith", func(p string) (*Config, error) { return LoadWith(p, LoadOptions{Compat: CompatEnvoy}) }},
	}
	for _, c := range []struct {
		path, reason string
		is           error
	}{
		{fifo, "not a regular file (named pipe)", safefile.ErrNotRegular},
		{zero, "not a regular file (character device)", safefile.ErrNotRegular},
		{big, "286.1MiB exceeds the limit of 16MiB (--rules-max-bytes)", safefile.ErrTooLarge},
	} {
		for _, l := range loads {
			err := noHang(t, l.name+" "+c.path, func() error { _, err := l.f(c.path); return err })
			var re *Error
			if !errors.As(err, &re) || re.File != c.path || re.Reason != c.reason || !errors.Is(err, c.is) {
				t.Errorf("%s(%s) = %v, want %s: %s", l.name, filepath.Base(c.path), err, c.path, c.reason)
			}
		}
	}

	// In a directory, each of them is an error of the load, the file named.
	for _, bad := range []func(string){
		func(p string) { mkfifo(t, p) },
		func(p string) { sparse(t, p, 300e6) },
		func(p string) {
			if err := os.Symlink("/dev/zero", p); err != nil {
				t.Fatal(err)
			}
		},
	} {
		d := t.TempDir()
		if err := os.WriteFile(filepath.Join(d, "a.yaml"), []byte(goodRules), 0o644); err != nil {
			t.Fatal(err)
		}
		bad(filepath.Join(d, "b.yaml"))
		err := noHang(t, "LoadDir", func() error { _, err := LoadDir(d); return err })
		if err == nil || !strings.HasPrefix(err.Error(), filepath.Join(d, "b.yaml")+": ") {
			t.Errorf("LoadDir with a bad b.yaml: %v", err)
		}
	}

	// The bound is an option; a file at it loads.
	small := filepath.Join(dir, "small.yaml")
	if err := os.WriteFile(small, []byte(goodRules), 0o644); err != nil {
		t.Fatal(err)
	}
	n := int64(len(goodRules))
	if _, err := LoadWith(small, LoadOptions{MaxFileBytes: n}); err != nil {
		t.Fatalf("a file of exactly MaxFileBytes: %v", err)
	}
	if _, err := LoadWith(small, LoadOptions{MaxFileBytes: n - 1}); !errors.Is(err, safefile.ErrTooLarge) {
		t.Fatalf("a file one byte over MaxFileBytes: %v", err)
	}
}
