package clock

import (
	"testing"
	"time"
)

func TestFake(t *testing.T) {
	start := time.Unix(1763740000, 0)
	f := NewFake(start)
	if got := f.Now(); !got.Equal(start) {
		t.Fatalf("Now = %v, want %v", got, start)
	}
	if got := f.Advance(1500 * time.Millisecond); !got.Equal(start.Add(1500 * time.Millisecond)) {
		t.Fatalf("Advance = %v", got)
	}
	f.Set(start)
	if got := f.Now(); !got.Equal(start) {
		t.Fatalf("after Set, Now = %v", got)
	}
	if _, ok := Or(nil).(Real); !ok {
		t.Fatal("Or(nil) is not Real")
	}
	if Or(f) != Clock(f) {
		t.Fatal("Or(f) did not return f")
	}
}
