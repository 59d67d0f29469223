package testenv

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"
)

// Link is the network between data centers on the way into one cluster: a TCP proxy in
// the test process (toxiproxy, embedded) that every client from another data center goes
// through. It adds WAN latency, and cuts and heals the link.
type Link struct {
	proxy *toxiproxy.Proxy
}

// NewLink starts a proxy listening on listen and forwarding to upstream, and stops it when
// the test ends. For the listener l := c.WAN[peer] of a KafkaCluster c: NewLink(t, peer+"->"+c.Name,
// l.Addr, l.Upstream).
func NewLink(t testing.TB, name, listen, upstream string) *Link {
	t.Helper()
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	p := toxiproxy.NewProxy(srv, name, listen, upstream)
	if err := p.Start(); err != nil {
		t.Fatalf("testenv: link %s on %s: %v", name, listen, err)
	}
	t.Cleanup(p.Stop)
	return &Link{proxy: p}
}

// Addr is where the link listens.
func (l *Link) Addr() string { return l.proxy.Listen }

// SetLatency delays every chunk of data by latency ± jitter (uniform), in each direction,
// so a round trip costs about twice latency. Chunks keep their order: it is one TCP stream.
// A second call replaces the first.
func (l *Link) SetLatency(latency, jitter time.Duration) error {
	for _, stream := range []string{"upstream", "downstream"} {
		name := "latency_" + stream
		_ = l.proxy.Toxics.RemoveToxic(context.Background(), name) // absent the first time
		body := fmt.Sprintf(`{"name":%q,"type":"latency","stream":%q,"attributes":{"latency":%d,"jitter":%d}}`,
			name, stream, latency.Milliseconds(), jitter.Milliseconds())
		if _, err := l.proxy.Toxics.AddToxicJson(strings.NewReader(body)); err != nil {
			return fmt.Errorf("link %s: latency: %w", l.proxy.Name, err)
		}
	}
	return nil
}

// Cut breaks the link: open connections are closed and new ones refused, as when a
// firewall rejects the traffic. Clients see errors at once and retry until Heal.
func (l *Link) Cut() { l.proxy.Stop() }

// Heal restores a cut link on the same address, with the same latency.
func (l *Link) Heal() error {
	if err := l.proxy.Start(); err != nil {
		return fmt.Errorf("link %s: heal: %w", l.proxy.Name, err)
	}
	return nil
}
