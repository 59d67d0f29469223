package main

import (
	"fmt"
	"strconv"
	"strings"
)

// byteSize is a flag value in bytes, written as a whole number with an optional binary
// unit (B, KiB, MiB, GiB, TiB: "256MiB", "2GiB", "1073741824"), or "none" for no bound
// (stored as -1).
type byteSize int64

var byteUnits = []struct {
	suffix string
	shift  uint
}{{"TiB", 40}, {"GiB", 30}, {"MiB", 20}, {"KiB", 10}, {"B", 0}}

func (b *byteSize) String() string {
	v := int64(*b)
	if v < 0 {
		return "none"
	}
	for _, u := range byteUnits {
		if v != 0 && v%(1<<u.shift) == 0 {
			return strconv.FormatInt(v>>u.shift, 10) + u.suffix
		}
	}
	return strconv.FormatInt(v, 10)
}

// Set parses s; a negative, fractional or overflowing size, or an unknown unit, is an
// error that says what is accepted.
func (b *byteSize) Set(s string) error {
	s = strings.TrimSpace(s)
	if s == "none" {
		*b = -1
		return nil
	}
	num, shift := s, uint(0)
	for _, u := range byteUnits {
		if rest, ok := strings.CutSuffix(s, u.suffix); ok {
			num, shift = strings.TrimSpace(rest), u.shift
			break
		}
	}
	v, err := strconv.ParseInt(num, 10, 64)
	if err != nil || v <= 0 || v > (1<<62)>>shift {
		return fmt.Errorf("%q: want a positive whole number of bytes with an optional unit B, KiB, MiB, GiB or TiB (e.g. 512MiB), or none", s)
	}
	*b = byteSize(v << shift)
	return nil
}

func (*byteSize) Type() string { return "bytes" }
