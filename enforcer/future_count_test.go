package enforcer

import (
	"testing"

	"github.com/streamlimit/streamlimit/topics"
)

// A count record dated 10 years ahead, claiming the key is far over its limit at another
// site, must not deny the key: the snapshot refuses it, so the key is decided as unknown.
func TestFutureCountDoesNotDeny(t *testing.T) {
	l, clk, sn, _ := newGlobal(t, nil, noDamping)
	c := topics.Count{Key: globalKey, Window: 60000, AsOf: clk.Now().AddDate(10, 0, 0).UnixMilli(), Total: 1000,
		Sites: []topics.SiteCount{{Site: "us", Count: 1000, Demand: 1000}}}
	v, err := c.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	_ = sn.Apply([]byte(globalKey), v) // refused: the error is the snapshot's to count
	if got := admitN(l, req42, 10); got != 10 {
		t.Fatalf("admitted %d of 10, want 10: the count from the future denied its key", got)
	}
}
