package testenv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/Shopify/toxiproxy/v2/stream"
	"github.com/rs/zerolog"
)

// Link is the network between data centers on the way into one cluster: a TCP proxy in
// the test process that every client from another data center goes through. It adds WAN
// latency (toxiproxy's toxics, embedded), and cuts and heals the link.
//
// The link owns its listening socket from NewLink until the test ends, cut or not: its
// address is advertised to clients (a broker's advertised listener) before anything runs
// behind it, and a port given up for a moment may be taken by anything on the machine.
// So the link accepts connections itself and hands them to toxiproxy's toxic chains,
// rather than letting toxiproxy's proxy listen, which closes the socket to stop and
// binds it again to start.
type Link struct {
	name  string
	ln    net.Listener
	srv   *toxiproxy.ApiServer
	proxy *toxiproxy.Proxy // never started: its toxics carry the connections

	mu       sync.Mutex
	upstream string
	cut      bool
	conns    map[net.Conn]struct{} // open connections, both sides, closed by Cut
	closed   bool

	done chan struct{} // closed when the accept loop has returned
}

// NewLink binds a loopback port of the link's own and forwards every connection accepted
// there to upstream, until the test ends. Addr is the address bound. An empty upstream
// refuses connections until SetUpstream: a link can be bound, and its address handed
// out, before the server behind it has a port.
func NewLink(t testing.TB, name, upstream string) *Link {
	t.Helper()
	l, err := newLink(name, upstream)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(l.close)
	return l
}

func newLink(name, upstream string) (*Link, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("link %s: %w", name, err)
	}
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	l := &Link{
		name:     name,
		ln:       ln,
		srv:      srv,
		proxy:    toxiproxy.NewProxy(srv, name, ln.Addr().String(), upstream),
		upstream: upstream,
		conns:    map[net.Conn]struct{}{},
		done:     make(chan struct{}),
	}
	go l.accept()
	return l, nil
}

// Addr is where the link listens, host:port.
func (l *Link) Addr() string { return l.ln.Addr().String() }

// Upstream is where the link forwards to.
func (l *Link) Upstream() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.upstream
}

// SetUpstream makes new connections go to upstream; open ones stay where they are.
func (l *Link) SetUpstream(upstream string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.upstream = upstream
}

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
			return fmt.Errorf("link %s: latency: %w", l.name, err)
		}
	}
	return nil
}

// Cut breaks the link: open connections are closed and new ones refused, as when a
// firewall rejects the traffic. Clients see errors at once and retry until Heal. The
// port stays the link's: a new connection is accepted and reset at once (a client sees
// "connection reset" where a firewall would give "connection refused"; either is an
// error at once), so that Heal never finds the address taken.
func (l *Link) Cut() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cut = true
	for c := range l.conns {
		_ = c.Close()
	}
	clear(l.conns)
}

// Heal restores a cut link, on the same address and with the same latency.
func (l *Link) Heal() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cut = false
}

// close stops accepting, closes every connection and waits for the accept loop.
func (l *Link) close() {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	l.Cut()
	_ = l.ln.Close()
	<-l.done
}

func (l *Link) accept() {
	defer close(l.done)
	for {
		c, err := l.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond) // out of descriptors, say: the port stays ours
			continue
		}
		go l.forward(c.(*net.TCPConn))
	}
}

// forward connects client to the upstream through the link's toxics, or resets it when
// the link is cut or has no upstream.
func (l *Link) forward(client *net.TCPConn) {
	l.mu.Lock()
	cut, upstream := l.cut || l.closed, l.upstream
	l.mu.Unlock()
	if cut || upstream == "" {
		reset(client)
		return
	}
	up, err := net.DialTimeout("tcp", upstream, 10*time.Second)
	if err != nil {
		reset(client) // as a proxy in front of a closed port does
		return
	}
	l.mu.Lock()
	if l.cut || l.closed { // cut while dialling
		l.mu.Unlock()
		reset(client)
		_ = up.Close()
		return
	}
	l.conns[client] = struct{}{}
	l.conns[up] = struct{}{}
	l.mu.Unlock()
	name := client.RemoteAddr().String()
	// Each direction's toxic chain closes its destination when its source ends; the
	// closer takes the connection off the list Cut closes.
	l.proxy.Toxics.StartLink(l.srv, name+"upstream", client, l.tracked(up), stream.Upstream)
	l.proxy.Toxics.StartLink(l.srv, name+"downstream", up, l.tracked(client), stream.Downstream)
}

// reset closes c with a TCP reset rather than an orderly end, as a refusal would.
func reset(c *net.TCPConn) {
	_ = c.SetLinger(0)
	_ = c.Close()
}

// tracked returns c as the destination of a toxic chain: closing it forgets it.
func (l *Link) tracked(c net.Conn) io.WriteCloser { return trackedConn{c, l} }

type trackedConn struct {
	net.Conn
	l *Link
}

func (c trackedConn) Close() error {
	c.l.mu.Lock()
	delete(c.l.conns, c.Conn)
	c.l.mu.Unlock()
	return c.Conn.Close()
}
