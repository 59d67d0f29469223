package topics

import (
	"encoding/binary"
	"regexp"
	"testing"
)

func appendVarint(b []byte, v int64) []byte   { return binary.AppendVarint(b, v) }
func appendUvarint(b []byte, v uint64) []byte { return binary.AppendUvarint(b, v) }

func regexpMatch(t *testing.T, re, s string) bool {
	t.Helper()
	return regexp.MustCompile(re).MatchString(s)
}
