package enforcer

import (
	"hash/maphash"
	"sync"
)

// keyCache interns counter keys, so that a decision builds a key in a reused byte buffer
// and gets back a string without allocating once the key has been seen. It is bounded:
// a full shard is emptied, which costs only re-interning.
type keyCache struct {
	seed   maphash.Seed
	max    int
	shards [32]struct {
		mu sync.RWMutex
		m  map[string]string
	}
}

func (c *keyCache) init(maxKeys int) {
	c.seed = maphash.MakeSeed()
	c.max = max(maxKeys/len(c.shards), 1)
	for i := range c.shards {
		c.shards[i].m = make(map[string]string)
	}
}

func (c *keyCache) intern(b []byte) string {
	sh := &c.shards[maphash.Bytes(c.seed, b)%uint64(len(c.shards))]
	sh.mu.RLock()
	s, ok := sh.m[string(b)]
	sh.mu.RUnlock()
	if ok {
		return s
	}
	s = string(b)
	sh.mu.Lock()
	if len(sh.m) >= c.max {
		clear(sh.m)
	}
	sh.m[s] = s
	sh.mu.Unlock()
	return s
}
