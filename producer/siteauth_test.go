package producer

import (
	"context"
	"encoding/hex"
	"fmt"
	"testing"
	"time"

	"github.com/streamlimit/streamlimit/topics"
)

// With a SiteKey, every record the Producer writes — hit batches, hit records of their
// own, site heartbeats and the leave records — carries a proof of its site that the
// site's key verifies; without one, none does.
func TestSiteKeySignsEveryRecord(t *testing.T) {
	const hexKey = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
	keys, err := topics.ParseSiteKeys([]byte("eu-1 " + hexKey))
	if err != nil {
		t.Fatal(err)
	}
	key, _ := hex.DecodeString(hexKey)
	for _, c := range []struct {
		name   string
		key    []byte
		single bool
	}{{"batches", key, false}, {"single hit records", key, true}, {"no key", nil, false}} {
		t.Run(c.name, func(t *testing.T) {
			fake := newFake(t, 3, "hits")
			p, err := New(Config{Brokers: fake.ListenAddrs(), Site: "eu-1", SiteKey: c.key, SingleHitRecords: c.single,
				FlushInterval: 5 * time.Millisecond, BucketWidth: 10 * time.Millisecond,
				SiteHeartbeatInterval: 20 * time.Millisecond, Logger: discard})
			if err != nil {
				t.Fatal(err)
			}
			for i := range 200 {
				p.Hit(fmt.Sprintf("k%d", i%16), time.Minute, 1)
				if i%20 == 0 {
					time.Sleep(10 * time.Millisecond)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := p.Close(ctx); err != nil {
				t.Fatal(err)
			}
			got := readTopic(t, fake.ListenAddrs(), "hits")
			if len(got.siteHeartbeats) == 0 || len(got.leaves) != 3 || (got.batches == 0) == !c.single {
				t.Fatalf("heartbeats on %d partitions, leaves on %d, %d batches", len(got.siteHeartbeats), len(got.leaves), got.batches)
			}
			verified := 0
			for _, r := range got.raw {
				var mac []byte
				for _, h := range r.Headers {
					if h.Key == topics.HeaderSiteMAC {
						mac = h.Value
					}
				}
				if err := keys.Verify([]byte("eu-1"), r.Value, mac); err == nil {
					verified++
				} else if c.key != nil {
					t.Fatalf("record %s/%d@%d (key %q): %v", r.Topic, r.Partition, r.Offset, r.Key, err)
				}
			}
			if c.key == nil && verified != 0 {
				t.Fatalf("%d records signed without a key", verified)
			}
			if c.key != nil && verified != len(got.raw) {
				t.Fatalf("%d of %d records verified", verified, len(got.raw))
			}
		})
	}
	if _, err := New(Config{Brokers: []string{"x:1"}, Site: "eu", SiteKey: key[:16]}); err == nil {
		t.Fatal("a 16-byte SiteKey accepted")
	}
}
