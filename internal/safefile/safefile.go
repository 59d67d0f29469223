// Package safefile reads a configuration file whose path an operator (or whoever can
// replace a symlink) chose, so that no path can hang or exhaust the process reading it.
// os.ReadFile of a FIFO without a writer blocks forever, of /dev/zero grows until memory
// runs out, and of a huge file holds all of it at once: Read opens without blocking,
// refuses anything that is not a regular file, and reads at most a bound.
package safefile

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strconv"
)

// ErrNotRegular is the error, wrapped, of a path that is not a regular file (after
// following symlinks): a directory, a named pipe, a device, a socket.
var ErrNotRegular = errors.New("not a regular file")

// ErrTooLarge is the error, wrapped, of a file longer than the bound Read was given.
var ErrTooLarge = errors.New("exceeds the limit")

// Read returns the contents of the regular file at path (symlinks followed) and its
// FileInfo as it was opened. It fails, without reading, on a path that is not a regular
// file (ErrNotRegular) or whose size exceeds maxBytes (ErrTooLarge), and it reads at most
// maxBytes+1 bytes, so a file that grows while it is read fails too instead of being read
// without end. The open does not block: a named pipe without a writer is refused at once.
// maxBytes <= 0 means no bound on the size.
func Read(path string, maxBytes int64) ([]byte, fs.FileInfo, error) {
	// O_NONBLOCK: opening a FIFO for reading otherwise waits for a writer. It changes
	// nothing for a regular file, whose reads never block.
	f, err := os.OpenFile(path, os.O_RDONLY|oNonblock, 0)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	// The opened file, not the path: the path may be swapped between a stat and the open.
	fi, err := f.Stat()
	if err != nil {
		return nil, nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fi, fmt.Errorf("%w (%s)", ErrNotRegular, kind(fi.Mode()))
	}
	if maxBytes > 0 && fi.Size() > maxBytes {
		return nil, fi, fmt.Errorf("%s %w of %s", Size(fi.Size()), ErrTooLarge, Size(maxBytes))
	}
	var r io.Reader = f
	if maxBytes > 0 {
		r = io.LimitReader(f, maxBytes+1)
	}
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, fi, err
	}
	if maxBytes > 0 && int64(len(data)) > maxBytes {
		return nil, fi, fmt.Errorf("grew while read: %w of %s", ErrTooLarge, Size(maxBytes))
	}
	return data, fi, nil
}

// kind names the type of a file that is not regular.
func kind(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "directory"
	case m&fs.ModeNamedPipe != 0:
		return "named pipe"
	case m&fs.ModeCharDevice != 0:
		return "character device"
	case m&fs.ModeDevice != 0:
		return "block device"
	case m&fs.ModeSocket != 0:
		return "socket"
	}
	return "mode " + m.String()
}

// Size formats n bytes in the largest binary unit that leaves at least 1, with one
// decimal when it is not whole: "16MiB", "286.1MiB", "512 bytes".
func Size(n int64) string {
	units := []string{"KiB", "MiB", "GiB", "TiB"}
	if n < 1024 {
		return strconv.FormatInt(n, 10) + " bytes"
	}
	i, v := -1, float64(n)
	for v >= 1024 && i < len(units)-1 {
		v /= 1024
		i++
	}
	if v == float64(int64(v)) {
		return strconv.FormatInt(int64(v), 10) + units[i]
	}
	return strconv.FormatFloat(v, 'f', 1, 64) + units[i]
}
