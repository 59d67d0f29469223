package enforcer

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/streamlimit/streamlimit/enforcer/sitecount"
	"github.com/streamlimit/streamlimit/enforcer/snapshot"
	"github.com/streamlimit/streamlimit/internal/memsize"
	"github.com/streamlimit/streamlimit/topics"
)

// keyCache interns counter keys, so that a decision builds a key in a reused byte buffer
// and gets back a string without allocating once the key has been seen. Each key comes
// with a keyHandle that caches what the decision path would otherwise look up again by key
// in other maps (the sitecount.Local's ring, the snapshot's entry): a decision's cost is
// dominated by memory latency, and one lookup instead of three is most of the saving.
//
// Lookups take no lock: each shard is an open-addressing table of (hash, handle) slots
// behind an atomic pointer, written only under the shard's mutex (a slot's handle is
// stored before its hash, so a reader that sees the hash sees the handle) and replaced
// whole when it grows or is emptied. A read-write mutex's read lock would write its shared
// counter on every lookup, and that cache line moves between cores at every decision.
//
// It is bounded in keys and in bytes, in two generations per shard, each given half of the
// shard's bounds: new keys go to the current table; when it is full it becomes the old
// one and the previous old one is dropped. A key found in the old table is copied to the
// current one with its handle, so that keys in use survive a flood of new ones with their
// caches, and only keys unused for a whole generation are dropped, which costs them a new
// handle and refilling its caches (handles are hints).
type keyCache struct {
	seed     maphash.Seed
	maxKeys  int   // per shard and generation
	maxBytes int64 // per shard and generation; 0: no bound
	shards   [keyShards]keyShard
}

const (
	keyShardBits = 5
	keyShards    = 1 << keyShardBits
	// minKeySlots is a new table's size: a power of two.
	minKeySlots = 8
)

type keyShard struct {
	tab atomic.Pointer[keyTable] // the current generation
	old atomic.Pointer[keyTable] // the previous generation; nil until the first is full
	mu  sync.Mutex               // held to change tab, old or their slots
	n   int                      // keys in tab
	// cur and prev are the bytes of tab and old: their tables and handles
	// (keyHandleBytes), global state included. Under mu.
	cur, prev int64
	// bytes is cur + prev, for readers without the lock.
	bytes atomic.Int64
	_     [16]byte // keep shards' mutexes on separate cache lines
}

// keyTable is one shard's open-addressing table, kept at most half full so that every
// probe sequence ends at an empty slot.
type keyTable struct {
	mask  uint64
	slots []keySlot
}

// keySlot is one slot of a keyTable: empty while hash is 0 (hashes are made odd).
type keySlot struct {
	hash atomic.Uint64
	h    atomic.Pointer[keyHandle]
}

// keyHandle is one interned counter key and the per-key state cached for it. The caches
// are hints, each re-validated before use, so a dropped or stale handle costs only a
// lookup. A key used only by local or site limits keeps just the key: what global
// decisions cache is in g, made the first time the key is decided globally.
type keyHandle struct {
	key string
	// ring caches the key's entry in a sitecount.Local (sitecount.Op.Handle).
	ring sitecount.Handle
	// g is the state cached for global decisions; nil until the first.
	g atomic.Pointer[keyGlobal]
}

// globalHandle is a handle made for a global limit, allocated with its global state, so
// that a decision reads both from adjacent memory.
type globalHandle struct {
	keyHandle
	g keyGlobal
}

// keyGlobal is what a global decision caches for one key.
type keyGlobal struct {
	// snap caches the snapshot's entry for the key as of version ver: valid while
	// Snapshot.Version still returns ver, and read again through ref (the key's own
	// slot, no map lookup) when another key's count moved the version. Guarded by mu, so
	// that refreshing it does not allocate.
	mu      sync.Mutex
	snapSet bool
	snapFor *snapshot.Snapshot
	ver     uint64
	ref     snapshot.Ref
	entry   snapshot.Entry
	known   bool
	// cc is the key's last global cap (see Engine.cachedCap).
	cc capCache
	// unknownAt is when a decision last found no count for the key (unix ns).
	unknownAt int64
	// frozen is the key's per-site breakdown from before any site went silent, seen at
	// frozenAt (unix ms); cand, seen at candAt, becomes frozen once every site has stayed
	// fresh for SiteStaleAfter after it (keepFrozen). The slices are the snapshot's
	// immutable breakdowns, shared, not copies.
	frozen, cand     []topics.SiteCount
	frozenAt, candAt int64
	// heavyUntil is until when the key counts as in demand beyond its limit (unix ms): it
	// gets no room ahead (Engine.finalCap) for a window after its demand was last seen
	// beyond heavyLoad.
	heavyUntil int64
	// past keeps the breakdown of a little while ago, by which the other sites' recent
	// rates are measured (recentRate).
	past pastDemand
	// arrSlot is the current period of arrivalPeriod (unix ms / arrivalPeriod), arrCur
	// and arrPrev this site's requests for the key in it and in the one before
	// (keyGlobal.arrive).
	arrSlot         int64
	arrCur, arrPrev float32
}

// Byte estimates of the key cache: the structures' sizes, each a size class of the
// allocator. The tables are counted whole (tableBytes), a quarter to a half full.
const (
	keyHandleSize = 32  // unsafe.Sizeof(keyHandle{}), checked by TestKeyCacheSizes
	keyGlobalSize = 448 // unsafe.Sizeof(keyGlobal{}), for a handle given its state later
	// globalHandleSize is unsafe.Sizeof(globalHandle{}), a size class of its own.
	globalHandleSize = 480
	keySlotBytes     = int64(unsafe.Sizeof(keySlot{}))
)

// keyHandleBytes is what one handle of a key of n bytes keeps alive, without its global
// state: the handle and the key's bytes.
func keyHandleBytes(n int) int64 { return keyHandleSize + memsize.Alloc(int64(n)) }

// tableBytes is what a table of n slots takes.
func tableBytes(n int) int64 { return int64(n) * keySlotBytes }

// init sets the bounds: at most maxKeys keys and maxBytes bytes (0: no byte bound).
func (c *keyCache) init(maxKeys int, maxBytes int64) {
	c.seed = maphash.MakeSeed()
	c.maxKeys = max(maxKeys/keyShards/2, 1)
	if maxBytes > 0 {
		c.maxBytes = max(maxBytes/keyShards/2, 1)
	}
	for i := range c.shards {
		sh := &c.shards[i]
		sh.tab.Store(newKeyTable(minKeySlots))
		sh.cur = tableBytes(minKeySlots)
		sh.bytes.Store(sh.cur)
	}
}

func newKeyTable(slots int) *keyTable {
	return &keyTable{mask: uint64(slots - 1), slots: make([]keySlot, slots)}
}

// find returns the handle of key b, of hash hash, or nil.
func (t *keyTable) find(hash uint64, b []byte) *keyHandle {
	for i := hash & t.mask; ; i = (i + 1) & t.mask {
		s := &t.slots[i]
		switch s.hash.Load() {
		case 0:
			return nil
		case hash:
			if h := s.h.Load(); h != nil && h.key == string(b) {
				return h
			}
		}
	}
}

// put stores h, of hash hash, in the first empty slot of its probe sequence. The caller
// holds the shard's mutex and has made room.
func (t *keyTable) put(hash uint64, h *keyHandle) {
	for i := hash & t.mask; ; i = (i + 1) & t.mask {
		s := &t.slots[i]
		if s.hash.Load() == 0 {
			s.h.Store(h)
			s.hash.Store(hash)
			return
		}
	}
}

func (c *keyCache) hash(b []byte) uint64 { return maphash.Bytes(c.seed, b) | 1 }

func (c *keyCache) shardOf(hash uint64) *keyShard { return &c.shards[hash>>(64-keyShardBits)] }

// handle returns the handle of key b, creating it when new; global makes the new handle
// ready for global decisions.
func (c *keyCache) handle(b []byte, global bool) *keyHandle {
	hash := c.hash(b)
	sh := c.shardOf(hash)
	if h := sh.tab.Load().find(hash, b); h != nil {
		return h
	}
	return c.insert(sh, hash, b, global)
}

// insert puts the handle of key b, of hash hash, in sh's current table: the old table's
// when it has one, else a new one.
func (c *keyCache) insert(sh *keyShard, hash uint64, b []byte, global bool) *keyHandle {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	t := sh.tab.Load()
	if h := t.find(hash, b); h != nil {
		return h
	}
	var h *keyHandle
	if o := sh.old.Load(); o != nil {
		h = o.find(hash, b)
	}
	switch {
	case h != nil: // from the old generation, with its caches
	case global:
		gh := &globalHandle{keyHandle: keyHandle{key: string(b)}}
		gh.keyHandle.g.Store(&gh.g)
		h = &gh.keyHandle
	default:
		h = &keyHandle{key: string(b)}
	}
	cost := keyHandleBytes(len(h.key))
	if h.g.Load() != nil {
		cost += globalHandleSize - keyHandleSize
	}
	slots := len(t.slots)
	if 2*(sh.n+1) > slots {
		slots *= 2
	}
	if sh.n+1 > c.maxKeys || (c.maxBytes > 0 && sh.cur+cost+tableBytes(slots)-tableBytes(len(t.slots)) > c.maxBytes) {
		// The current generation is full: it becomes the old one, and the old one is
		// dropped (handles held by decisions in flight stay valid).
		sh.old.Store(t)
		sh.prev = sh.cur
		t, sh.n, sh.cur = newKeyTable(minKeySlots), 0, tableBytes(minKeySlots)
		sh.tab.Store(t)
	} else if slots > len(t.slots) {
		nt := newKeyTable(slots)
		for i := range t.slots {
			if hs := t.slots[i].hash.Load(); hs != 0 {
				nt.put(hs, t.slots[i].h.Load())
			}
		}
		sh.cur += tableBytes(slots) - tableBytes(len(t.slots))
		t = nt
		sh.tab.Store(t)
	}
	t.put(hash, h)
	sh.n++
	sh.cur += cost
	sh.bytes.Store(sh.cur + sh.prev)
	return h
}

// globalOf returns h's global state, making it when h was made for a local limit only
// (and counting it in the current generation's bytes).
func (c *keyCache) globalOf(h *keyHandle) *keyGlobal {
	if g := h.g.Load(); g != nil {
		return g
	}
	g := new(keyGlobal)
	if !h.g.CompareAndSwap(nil, g) {
		return h.g.Load()
	}
	sh := c.shardOf(c.hash([]byte(h.key)))
	sh.mu.Lock()
	sh.cur += keyGlobalSize
	sh.bytes.Store(sh.cur + sh.prev)
	sh.mu.Unlock()
	return g
}

// bytes returns what the cache keeps alive, by the estimates above.
func (c *keyCache) bytes() int64 {
	var n int64
	for i := range c.shards {
		n += c.shards[i].bytes.Load()
	}
	return n
}
