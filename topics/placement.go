package topics

// Placement. A counter key lives on one partition of a hits topic and of the counts topic:
// Kafka's default placement of the key, which the Java client, franz-go's
// kgo.StickyKeyPartitioner and librdkafka's murmur2_random partitioner share —
// murmur2 of the key's bytes, high bit cleared, modulo the partition count. The producer
// places hits and hit batches by it, the aggregator owns, re-routes and publishes by it,
// and any reader finds a key by it. Records keyed under ReservedPrefix (site records, hit
// batches, aggregator heartbeats) are not placed by key: each names its partition.

// Partition is Kafka's default partition of key among n partitions (n ≥ 1).
func Partition(key []byte, n int32) int32 { return PartitionOfHash(Murmur2(key), n) }

// PartitionOfHash is Partition for a key whose Murmur2 hash is h.
func PartitionOfHash(h uint32, n int32) int32 { return int32((h & 0x7fffffff) % uint32(n)) }

// Murmur2 is Kafka's murmur2 hash of b (org.apache.kafka.common.utils.Utils.murmur2).
func Murmur2(b []byte) uint32 {
	const (
		seed uint32 = 0x9747b28c
		m    uint32 = 0x5bd1e995
		r           = 24
	)
	h := seed ^ uint32(len(b))
	for len(b) >= 4 {
		k := uint32(b[3])<<24 | uint32(b[2])<<16 | uint32(b[1])<<8 | uint32(b[0])
		b = b[4:]
		k *= m
		k ^= k >> r
		k *= m
		h *= m
		h ^= k
	}
	switch len(b) {
	case 3:
		h ^= uint32(b[2]) << 16
		fallthrough
	case 2:
		h ^= uint32(b[1]) << 8
		fallthrough
	case 1:
		h ^= uint32(b[0])
		h *= m
	}
	h ^= h >> 13
	h *= m
	h ^= h >> 15
	return h
}
