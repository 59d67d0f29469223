package enforcer

import (
	"hash/maphash"
	"sync"
	"sync/atomic"

	"github.com/streamlimit/streamlimit/enforcer/snapshot"
)

// keyCache interns counter keys, so that a decision builds a key in a reused byte buffer
// and gets back a string without allocating once the key has been seen. Each key comes
// with a keyHandle that caches what the decision path would otherwise look up again by key
// in other maps (the LocalCounter's ring, the snapshot's entry): a decision's cost is
// dominated by memory latency, and one map lookup instead of three is most of the saving.
// It is bounded: a full shard is emptied, which costs only re-interning and refilling the
// handles' caches.
type keyCache struct {
	seed   maphash.Seed
	max    int
	shards [32]keyShard
}

type keyShard struct {
	mu sync.RWMutex
	m  map[string]*keyHandle
	_  [32]byte // one shard per cache line: the read lock's counter is written
}

// keyHandle is one interned counter key and the per-key state cached for it. The caches
// are hints, each re-validated before use, so a dropped or stale handle costs only a
// lookup.
type keyHandle struct {
	key string
	// ring is the key's entry in a LocalCounter, valid while the entry is not dead
	// (checked under the entry's shard lock).
	ring atomic.Pointer[ringEntry]

	// snap caches the snapshot's entry for the key as of version ver: valid while
	// Snapshot.Version still returns ver. Guarded by mu, so that refreshing it does not
	// allocate.
	mu      sync.Mutex
	snapSet bool
	snapFor *snapshot.Snapshot
	ver     uint64
	entry   snapshot.Entry
	known   bool
	// cc is the key's last global cap (see Limiter.cachedCap).
	cc capCache
	// unknownAt is when a decision last found no count for the key (unix ns).
	unknownAt int64

	// ringMem is memory for the key's first LocalCounter entry, claimed by ringUsed, so
	// that the entry shares cache lines with the handle. It is last so that the fields
	// above and the entry's header share the first lines, its buckets after them.
	ringUsed atomic.Bool
	ringMem  ringEntry
}

func (c *keyCache) init(maxKeys int) {
	c.seed = maphash.MakeSeed()
	c.max = max(maxKeys/len(c.shards), 1)
	for i := range c.shards {
		c.shards[i].m = make(map[string]*keyHandle)
	}
}

// handle returns the handle of key b, creating it when new.
func (c *keyCache) handle(b []byte) *keyHandle {
	sh := &c.shards[maphash.Bytes(c.seed, b)%uint64(len(c.shards))]
	sh.mu.RLock()
	h, ok := sh.m[string(b)]
	sh.mu.RUnlock()
	if ok {
		return h
	}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if h, ok = sh.m[string(b)]; ok {
		return h
	}
	if len(sh.m) >= c.max {
		clear(sh.m)
	}
	h = &keyHandle{key: string(b)}
	sh.m[h.key] = h
	return h
}

func (c *keyCache) intern(b []byte) string { return c.handle(b).key }
