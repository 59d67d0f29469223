package enforcer

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Engine.Sites classifies as the decisions and streamlimit_enforcer_sites do: eu (this
// site) fresh, ap silent while its data center's other site speaks (crashed), us and ca
// silent on a topic where nobody speaks (cut), jp left.
func TestSitesClassifiesAsTheDecisions(t *testing.T) {
	l, clk, sn := sitesLimiter(t)
	now := clk.Now()
	ms := now.UnixMilli()
	silentAt := ms - 5_000
	sourceHeartbeat(t, sn, clk, "hits", map[string]int64{"eu": ms, "ap": silentAt, "nz": ms - 100}, nil)
	sourceHeartbeat(t, sn, clk, "us.hits", map[string]int64{"us": silentAt, "ca": silentAt}, map[string]int64{"jp": ms - 2_000})

	got := l.Sites(now)
	want := []SiteStatus{
		{Site: "ap", State: "crashed", Heard: time.UnixMilli(silentAt), Silent: 5 * time.Second, Peer: time.UnixMilli(ms)},
		{Site: "ca", State: "cut", Heard: time.UnixMilli(silentAt), Silent: 5 * time.Second, Peer: time.UnixMilli(silentAt)},
		{Site: "eu", State: "fresh", Self: true, Heard: time.UnixMilli(ms), Peer: time.UnixMilli(ms - 100)},
		{Site: "jp", State: "left", Heard: time.UnixMilli(ms - 2_000), Peer: time.UnixMilli(silentAt)},
		{Site: "nz", State: "fresh", Heard: time.UnixMilli(ms - 100), Peer: time.UnixMilli(ms)},
		{Site: "us", State: "cut", Heard: time.UnixMilli(silentAt), Silent: 5 * time.Second, Peer: time.UnixMilli(silentAt)},
	}
	if len(got) != len(want) {
		t.Fatalf("Sites = %+v, want %+v", got, want)
	}
	for i := range want {
		if g, w := got[i], want[i]; g.Site != w.Site || g.State != w.State || g.Self != w.Self || !g.Heard.Equal(w.Heard) ||
			g.Silent != w.Silent || !g.Peer.Equal(w.Peer) {
			t.Errorf("site %d = %+v, want %+v", i, g, w)
		}
	}
	// The same counts as the metric.
	n := map[string]float64{}
	for _, s := range got {
		n[s.State]++
	}
	c := &siteStates{l: l, desc: prometheus.NewDesc("streamlimit_enforcer_sites", "", []string{"state"}, nil)}
	ch := make(chan prometheus.Metric, 4)
	c.Collect(ch)
	close(ch)
	for m := range ch {
		var pb dto.Metric
		if err := m.Write(&pb); err != nil {
			t.Fatal(err)
		}
		state := pb.GetLabel()[0].GetValue()
		if v := pb.GetGauge().GetValue(); v != n[state] {
			t.Errorf("streamlimit_enforcer_sites{state=%q} = %v, Sites counts %v", state, v, n[state])
		}
	}
}

// Without a snapshot, or before any heartbeat, the Engine's own site is listed, fresh.
func TestSitesListsThisSiteAlone(t *testing.T) {
	l, clk := newLimiter(t, localRules, nil)
	got := l.Sites(clk.Now())
	if len(got) != 1 || got[0].Site != "eu" || got[0].State != "fresh" || !got[0].Self || !got[0].Heard.IsZero() {
		t.Fatalf("Sites = %+v, want eu alone, fresh, never heard", got)
	}
}
