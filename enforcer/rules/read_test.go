//go:build unix

package rules

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"testing/synctest"
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

// rulesWith is a rules file with a user limit of n a minute and, unless half, an ip limit
// of 10 a minute after it: its first half alone is a good file without the ip rule.
func rulesWith(n int, half bool) string {
	s := "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: " + strconv.Itoa(n) + "}\n"
	if !half {
		s += "  - key: ip\n    rate_limit: {unit: minute, requests_per_unit: 10}\n"
	}
	return s
}

// userLimit is the user limit of c, or -1.
func userLimit(c *Config) int64 {
	if r := c.Match("api", e("user", "1")); r != nil {
		return r.Limits[0].Requests
	}
	return -1
}

// link points the symlink at path to target, atomically (a new link renamed over it), as
// deployments that switch a rules symlink do.
func link(t *testing.T, target, path string) {
	t.Helper()
	tmp := path + ".new"
	if err := os.Symlink(target, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// A running reloader whose rules symlink is swapped to /dev/zero or to a file over the
// size bound keeps the rules in force, logs and counts a failure at each
// check, and carries on: once the link points at a good file again, that file loads.
// Before, /dev/zero made the process die of memory within 2 s, and a 300 MB file was read
// whole.
func TestReloaderSurvivesBadTargets(t *testing.T) {
	for _, c := range []struct {
		name, reason string
		is           error
		target       func(t *testing.T, dir string) string
	}{
		{"dev-zero", "not a regular file (character device)", safefile.ErrNotRegular,
			func(*testing.T, string) string { return "/dev/zero" }},
		{"oversized", "286.1MiB exceeds the limit of 16MiB (--rules-max-bytes)", safefile.ErrTooLarge,
			func(t *testing.T, dir string) string {
				p := filepath.Join(dir, "big.yaml")
				sparse(t, p, 300e6)
				return p
			}},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				dir := t.TempDir()
				good := filepath.Join(dir, "v1.yaml")
				writeFile(t, good, rulesWith(5, false))
				path := filepath.Join(dir, "rules.yaml")
				link(t, good, path)
				var logs syncBuffer
				r, err := NewReloader(path, ReloaderOptions{Interval: time.Second, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithCancel(t.Context())
				defer cancel()
				go func() { _ = r.Run(ctx) }()

				link(t, c.target(t, dir), path)
				time.Sleep(3*time.Second + time.Millisecond) // three checks
				synctest.Wait()
				st := r.Stats()
				var re *Error
				if !errors.As(st.LastError, &re) || re.Reason != c.reason || !errors.Is(st.LastError, c.is) {
					t.Fatalf("last error %v, want %s", st.LastError, c.reason)
				}
				if st.Failures != 3 || st.Reloads != 0 || userLimit(r.Current()) != 5 {
					t.Fatalf("after 3 checks of a bad target: %+v, user limit %d", st, userLimit(r.Current()))
				}
				if !strings.Contains(logs.String(), c.reason) {
					t.Fatalf("the failure is not logged: %s", logs.String())
				}

				v2 := filepath.Join(dir, "v2.yaml")
				writeFile(t, v2, rulesWith(7, false))
				link(t, v2, path)
				time.Sleep(time.Second + DefaultReloadSettle) // seen, then settled
				synctest.Wait()
				if st := r.Stats(); userLimit(r.Current()) != 7 || st.Reloads != 1 || st.LastError != nil {
					t.Fatalf("after the link is back on a good file: %+v, user limit %d", st, userLimit(r.Current()))
				}
			})
		})
	}
}

// A reloader whose rules symlink is swapped to a named pipe without a writer refuses it at
// once instead of blocking in the open, keeps the rules in force, and loads the next good
// file the link points to. Before, the reloader blocked in the open for ever, without a
// word, and later edits were never loaded.
func TestReloaderRefusesFIFO(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "v1.yaml")
	writeFile(t, good, rulesWith(5, false))
	path := filepath.Join(dir, "rules.yaml")
	link(t, good, path)
	var logs syncBuffer
	r, err := NewReloader(path, ReloaderOptions{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo")
	mkfifo(t, fifo)
	link(t, fifo, path)
	err = noHang(t, "Check of a FIFO", func() error { _, err := r.Check(); return err })
	if !errors.Is(err, safefile.ErrNotRegular) || !strings.Contains(err.Error(), "not a regular file (named pipe)") {
		t.Fatalf("Check of a FIFO: %v", err)
	}
	if st := r.Stats(); st.Failures != 1 || userLimit(r.Current()) != 5 {
		t.Fatalf("after a FIFO: %+v, user limit %d", st, userLimit(r.Current()))
	}
	if !strings.Contains(logs.String(), "not a regular file (named pipe)") {
		t.Fatalf("the FIFO is not logged: %s", logs.String())
	}

	v2 := filepath.Join(dir, "v2.yaml")
	writeFile(t, v2, rulesWith(7, false))
	link(t, v2, path)
	for range 2 { // seen, then settled
		if err := noHang(t, "Check", func() error { _, err := r.Check(); return err }); err != nil {
			t.Fatal(err)
		}
	}
	if userLimit(r.Current()) != 7 {
		t.Fatalf("after the link is back on a good file: user limit %d", userLimit(r.Current()))
	}
}

// A rules file rewritten in place (truncated, then written in two parts, as `cat >` or an
// editor that does not rename does) is never loaded half-written, although a check sees
// it half-written and that half is a good rules file short of a rule: the change is
// loaded once it has stayed as it is for the settle interval. Before, the first half was
// loaded and the ip rule was missing until the next check.
func TestReloaderWaitsForInPlaceWrite(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		path := filepath.Join(dir, "rules.yaml")
		writeFile(t, path, rulesWith(5, false))
		var loaded []*Config
		r, err := NewReloader(path, ReloaderOptions{Interval: time.Second, OnReload: func(c *Config) { loaded = append(loaded, c) }})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go func() { _ = r.Run(ctx) }()

		time.Sleep(500 * time.Millisecond)
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
		if err != nil {
			t.Fatal(err)
		}
		full := rulesWith(7, false)
		half := rulesWith(7, true)
		if _, err := f.WriteString(half); err != nil {
			t.Fatal(err)
		}
		time.Sleep(600 * time.Millisecond) // the check at 1 s sees the first half
		synctest.Wait()
		if _, err := f.WriteString(full[len(half):]); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(3 * time.Second)
		synctest.Wait()
		for i, c := range loaded {
			if c.Match("api", e("ip", "1")) == nil {
				t.Errorf("reload %d loaded the half-written file (no ip rule)", i+1)
			}
		}
		if st := r.Stats(); len(loaded) != 1 || userLimit(r.Current()) != 7 || st.Reloads != 1 || st.Failures != 0 {
			t.Fatalf("%d reloads, stats %+v, user limit %d; want the whole file loaded once", len(loaded), st, userLimit(r.Current()))
		}
	})
}

func writeFile(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}
