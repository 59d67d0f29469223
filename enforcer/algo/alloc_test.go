//go:build !race

// Allocation counts are meaningless under -race; make test runs the tests of the files
// that compile only without it in a race-free pass first.

package algo

import (
	"fmt"
	"testing"
	"time"
)

// Once a key exists, Allow, AllowAll (admitted, and denied with its rollback), Peek and
// Reserve allocate nothing, for every algorithm, although they reach the algorithms
// through the registration table.
func TestNoAllocation(t *testing.T) {
	s := New(Options{})
	l := Limit{Requests: 1 << 40, Window: time.Minute}
	for _, a := range Algorithms() {
		op := Op{Key: fmt.Sprint("k", a, a.Calendar()), Algorithm: a, Limit: l, N: 1}
		deny := Op{Key: fmt.Sprint("d", a, a.Calendar()), Algorithm: a, Limit: Limit{Requests: 1, Window: time.Minute}, N: 1}
		ops := []Op{op, deny}
		out := make([]Decision, 2)
		now := base
		s.Allow(now, op)
		s.Allow(now, deny)
		for name, f := range map[string]func(){
			"Allow":    func() { now = now.Add(time.Microsecond); s.Allow(now, op) },
			"AllowAll": func() { now = now.Add(time.Microsecond); s.AllowAll(now, ops, out) },
			"Peek":     func() { s.Peek(now, op) },
			"Reserve":  func() { now = now.Add(time.Microsecond); s.Reserve(now, op, Never) },
		} {
			if n := testing.AllocsPerRun(100, f); n != 0 {
				t.Errorf("%v %s: %v allocations", a, name, n)
			}
		}
		if s.AllowAll(now, ops, out) {
			t.Fatalf("%v: the second limit did not deny", a)
		}
	}
}
