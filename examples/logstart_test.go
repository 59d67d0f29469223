package examples

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamlimit/streamlimit/internal/testenv"
	"github.com/streamlimit/streamlimit/topics"
)

// offsetOutOfRange is what librdkafka logs when a fetch asks for an offset the broker no
// longer has, before it resets the partition.
const offsetOutOfRange = "Offset out of range"

// TestPythonClientFromLogStart runs the Python example against a counts topic whose
// partitions no longer start at offset 0, as compaction leaves them (on `streamlimit
// dev`'s broker within minutes): the client must read from each partition's log start,
// without librdkafka's "Offset out of range" reset, and find the key's count.
func TestPythonClientFromLogStart(t *testing.T) {
	testenv.RealParts(t)
	python, err := exec.LookPath("python3")
	if err == nil {
		err = exec.Command(python, "-c", "import confluent_kafka").Run()
	}
	if err != nil {
		need(t, "python3 with confluent-kafka", "pip install -r examples/python/requirements.txt")
	}
	const partitions = 3
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, topics.DefaultHitsTopic, topics.DefaultCountsTopic))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// Two superseded records at the head of every partition, then deleted, as compaction
	// and the log cleaner remove them: each partition's log start becomes 2.
	dropped := kadm.Offsets{}
	for p := range int32(partitions) {
		for range 2 {
			r := &kgo.Record{Topic: topics.DefaultCountsTopic, Partition: p, Key: []byte("old"), Value: []byte(`{}`)}
			if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
		dropped.Add(kadm.Offset{Topic: topics.DefaultCountsTopic, Partition: p, At: 2})
	}
	resp, err := kadm.NewClient(cl).DeleteRecords(ctx, dropped)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		t.Fatalf("delete records: %v", err)
	}

	// The count the client waits for, as an aggregator would write it.
	key := "api|user=logstart#1m0s"
	c := topics.Count{Key: key, Window: 60_000, AsOf: time.Now().UnixMilli(), Total: 5, Sites: []topics.SiteCount{{Site: "py", Count: 5}}}
	v, err := c.AppendJSON(nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topics.DefaultCountsTopic, Partition: 1, Key: []byte(key), Value: v}).FirstErr(); err != nil {
		t.Fatal(err)
	}

	out, err := exec.CommandContext(ctx, python, filepath.Join("python", "streamlimit_client.py"),
		"--brokers", strings.Join(brokers, ","), "--key", key, "--site", "py", "--hits", "5", "--timeout", "30").CombinedOutput()
	t.Logf("python client:\n%s", out)
	if err != nil {
		t.Fatalf("python client: %v", err)
	}
	if want := "count " + key + " total=5 py=5\n"; !strings.HasSuffix(string(out), want) {
		t.Errorf("python client printed %q, want it to end with %q", out, want)
	}
	if n := strings.Count(string(out), offsetOutOfRange); n != 0 {
		t.Errorf("python client logged %q %d times: it fetched below the log start", offsetOutOfRange, n)
	}
}
