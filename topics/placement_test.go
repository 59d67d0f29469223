package topics_test

import (
	"strconv"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamlimit/streamlimit/topics"
)

// Partition places keys as franz-go's StickyKeyPartitioner does, which places them as the
// Java client does.
func TestPartitionMatchesKafkaPartitioner(t *testing.T) {
	p := kgo.StickyKeyPartitioner(nil).ForTopic("t")
	for i := range 2000 {
		key := []byte("api:POST /articles|user=" + strconv.Itoa(i) + string(make([]byte, i%5)))
		for _, n := range []int32{1, 3, 4, 12, 100} {
			want := p.Partition(&kgo.Record{Key: key}, int(n))
			if got := topics.Partition(key, n); int(got) != want {
				t.Fatalf("key %q n=%d: %d, kgo says %d", key, n, got, want)
			}
		}
	}
}
