package enforcer

import (
	"strconv"
	"sync"
	"testing"
	"unsafe"
)

// The byte estimates of the key cache must not be below the
// structures' real sizes, or the budgets would let more memory be held than they say.
func TestKeyCacheSizes(t *testing.T) {
	for _, c := range []struct {
		name      string
		size, est uintptr
	}{
		{"keyHandle", unsafe.Sizeof(keyHandle{}), keyHandleSize},
		{"keyGlobal", unsafe.Sizeof(keyGlobal{}), keyGlobalSize},
		{"globalHandle", unsafe.Sizeof(globalHandle{}), globalHandleSize},
	} {
		if c.size > c.est {
			t.Errorf("%s is %d bytes, estimated %d", c.name, c.size, c.est)
		}
	}
}

// TestKeyCacheBounds interns keys from several goroutines into a cache bounded in bytes:
// every lookup returns the key asked for and the bytes held stay within the bound; in a
// cache large enough, a key asked again gets the same handle, across the tables' growth.
func TestKeyCacheBounds(t *testing.T) {
	const budget = 256 << 10
	var kc keyCache
	kc.init(1<<20, budget)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 20_000 {
				k := []byte("api|user=" + strconv.Itoa(g*1_000_000+i) + "#60s")
				h := kc.handle(k, i%2 == 0)
				if h.key != string(k) {
					t.Errorf("handle(%s) has key %s", k, h.key)
					return
				}
				if i%2 == 1 && kc.globalOf(h) == nil {
					t.Error("no global state")
					return
				}
			}
		})
	}
	wg.Wait()
	if b := kc.bytes(); b > budget || b < budget/4 {
		t.Errorf("key cache holds %d bytes, bound %d", b, budget)
	}
	var big keyCache
	big.init(1<<20, 0)
	hs := make([]*keyHandle, 50_000)
	for i := range hs {
		hs[i] = big.handle([]byte(strconv.Itoa(i)), false)
	}
	for i := range hs {
		if h := big.handle([]byte(strconv.Itoa(i)), true); h != hs[i] {
			t.Fatalf("key %d: another handle the second time", i)
		}
	}
}

// TestKeyCacheKeepsKeysInUse floods a small cache with new keys while one key is asked for
// every 100: that key keeps its handle (and the caches in it) through every generation,
// while a key asked for once is dropped after two.
func TestKeyCacheKeepsKeysInUse(t *testing.T) {
	var kc keyCache
	kc.init(1<<20, 1<<20)
	hot := []byte("api|user=hot#60s")
	h := kc.handle(hot, true)
	cold := kc.handle([]byte("api|user=cold#60s"), true)
	for i := range 200_000 {
		kc.handle([]byte("api|user="+strconv.Itoa(i)+"#60s"), true)
		if i%100 == 0 {
			if kc.handle(hot, true) != h {
				t.Fatalf("after %d new keys, the key in use has a new handle", i)
			}
		}
	}
	if kc.handle([]byte("api|user=cold#60s"), true) == cold {
		t.Error("a key unused for 200 000 new keys kept its handle")
	}
	if b := kc.bytes(); b > 1<<20 {
		t.Errorf("%d bytes, bound %d", b, 1<<20)
	}
}
