//go:build unix

// Package safefiletest makes the files that a careful reader must refuse rather than read
// (safefile.Read and every command that reads a path through it), for the tests of the
// reader and of the commands: a FIFO with no writer, on which a plain read blocks for ever,
// and a file far over any size bound, which a plain read loads whole.
package safefiletest

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// BigSize is the size of the file Hostile makes: 300 MB, 286.1 MiB as the reader's errors
// print it.
const BigSize = 300e6

// Hostile makes, in dir, a FIFO with no writer named fifo (plus ext) and a sparse file of
// BigSize bytes named big (plus ext), which takes no disk blocks, and returns their paths.
// It fails t when it cannot.
func Hostile(t testing.TB, dir, ext string) (fifo, big string) {
	t.Helper()
	fifo = filepath.Join(dir, "fifo"+ext)
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	big = filepath.Join(dir, "big"+ext)
	f, err := os.Create(big)
	if err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(f.Truncate(BigSize), f.Close()); err != nil {
		t.Fatal(err)
	}
	return fifo, big
}
