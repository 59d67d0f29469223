package snapshot

import (
	"testing"

	"github.com/streamlimit/streamlimit/topics"
)

// A site is Served once a count showed it with hits or demand; a site known only from
// heartbeats, or shown with neither, is not.
func TestSiteServed(t *testing.T) {
	f := newFixture(t, Config{})
	now := f.clk.Now().UnixMilli()
	beat := func() {
		t.Helper()
		hb := topics.Heartbeat{Instance: "agg", Topic: "hits", AsOf: now, Sites: map[string]int64{"eu": now, "us": now, "ap": now, "ghost": now}}
		v, err := hb.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		f.apply(t, topics.HeartbeatKey("hits", 0), v)
	}
	beat()
	c := topics.Count{Key: "k", Window: 60_000, AsOf: now, Total: 3, Sites: []topics.SiteCount{
		{Site: "ap"}, {Site: "eu", Count: 3}, {Site: "us", Demand: 0.5}}}
	v, err := c.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	f.apply(t, "k", v)
	beat()
	want := map[string]bool{"eu": true, "us": true, "ap": false, "ghost": false}
	for site, served := range want {
		if st, ok := f.s.SiteTimes().Get(site); !ok || st.Served != served {
			t.Errorf("%s: %+v, want Served %v", site, st, served)
		}
	}
}
