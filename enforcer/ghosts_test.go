package enforcer

import (
	"fmt"
	"testing"
	"time"

	"github.com/streamlimit/streamlimit/enforcer/snapshot"
	"github.com/streamlimit/streamlimit/internal/clock"
	"github.com/streamlimit/streamlimit/topics"
)

// ghostHeartbeat applies an aggregator heartbeat, as of now, of partition 1 of the local
// hits topic that lists sites no count ever showed: what anyone allowed to write the hits
// topic makes by writing site heartbeats in made-up names.
func ghostHeartbeat(t *testing.T, sn *snapshot.Snapshot, clk clock.Clock, n int) {
	t.Helper()
	hb := topics.Heartbeat{Instance: "agg", Topic: "hits", Partition: 1, AsOf: clk.Now().UnixMilli(), Sites: map[string]int64{}}
	for i := range n {
		hb.Sites[fmt.Sprintf("ghost-%02d", i)] = clk.Now().UnixMilli()
	}
	v, err := hb.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	if err := sn.Apply([]byte(topics.HeartbeatKey("hits", 1)), v); err != nil {
		t.Fatal(err)
	}
}

// Heartbeats of 50 made-up sites, which never served a key, change nothing: eu and us, the
// real sites of one data center, split a key new to the snapshot as two sites do, and a
// client at 80% of its limit at eu, its counts coming back through the snapshot, is never
// denied. Before, eu spent a 52nd of a new key's limit (2 of 100, 50 without ghosts) and
// the client was denied 50 of its 80 requests.
func TestGhostSitesCostNothing(t *testing.T) {
	run := func(ghosts int) (newKey, admitted int) {
		l, clk, sn := sitesLimiter(t)
		beat := func() {
			now := clk.Now().UnixMilli()
			sourceHeartbeat(t, sn, clk, "hits", map[string]int64{"eu": now, "us": now}, nil)
			if ghosts > 0 {
				ghostHeartbeat(t, sn, clk, ghosts)
			}
		}
		beat()
		newKey = admitN(l, req7, 200)
		// The client: 4 requests every 3 s at eu, 80 in the minute against 100, its
		// count published back after each round.
		for range 20 {
			admitted += admitN(l, req42, 4)
			clk.Advance(3 * time.Second)
			putCount(t, sn, clk, globalKey, map[string]float64{"eu": float64(admitted)}, nil)
			beat()
		}
		return newKey, admitted
	}
	baseNew, baseAdmitted := run(0)
	if baseAdmitted != 80 {
		t.Fatalf("without ghosts the client got %d of its 80 requests", baseAdmitted)
	}
	gotNew, gotAdmitted := run(50)
	if gotNew != baseNew {
		t.Errorf("a key new to the snapshot: %d admitted with 50 ghost sites, %d without", gotNew, baseNew)
	}
	if gotAdmitted != 80 {
		t.Errorf("with 50 ghost sites the client at 80%% of its limit got %d of 80 (%d denied), want 80", gotAdmitted, 80-gotAdmitted)
	}
}
