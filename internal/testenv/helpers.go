package testenv

import (
	"bytes"
	"net"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Eventually polls cond every 20 ms until it holds, and fails t naming what it waited for
// once timeout has passed.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago. Anything on the
// machine may take it before it is bound, so it is only for a process that must be told
// its port and cannot report one it chose (redis-server, a JVM, envoyproxy/ratelimit),
// and whose start is retried on another port when the bind fails. A listener of the test
// process binds 127.0.0.1:0 and keeps the socket; a streamlimit command is given port 0
// and prints the address it bound.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// SyncBuffer is a bytes.Buffer safe for one writer and readers at once: a log or a
// command's output read while it is written.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns what was written so far.
func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// Unavailable ends a test that cannot run here: it fails under CI=true, where everything a
// test needs must be present (a skipped test proves nothing), and skips otherwise.
func Unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf(format, args...)
	}
	t.Skipf(format, args...)
}

// Tool returns the path of the command name, or ends the test with Unavailable and hint
// (how to install it). A test looks a tool up to run it, so Tool calls RealParts first.
func Tool(t testing.TB, name, hint string) string {
	t.Helper()
	RealParts(t)
	p, err := exec.LookPath(name)
	if err != nil {
		Unavailable(t, "%s is not installed: %s", name, hint)
	}
	return p
}

// Counter returns the value of the counter called name that reg gathers, summed over its
// series (0 when reg has none).
func Counter(t testing.TB, reg prometheus.Gatherer, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var v float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				v += m.GetCounter().GetValue()
			}
		}
	}
	return v
}
