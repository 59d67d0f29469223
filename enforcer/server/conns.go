package server

import (
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
)

// perAddrListener holds at most max connections from one client address at once (IPv6
// grouped by /64, which one client commonly holds whole): a connection past that is
// closed as soon as it is accepted, so that one client, however many connections it opens
// and leaves silent, cannot take the listener's connections (Limits.MaxConns) from the
// others. The bound applies to the connection's peer: behind a proxy, that is the proxy.
type perAddrListener struct {
	net.Listener
	max     int
	refused *atomic.Uint64

	mu    sync.Mutex
	conns map[netip.Addr]int
}

func newPerAddrListener(ln net.Listener, max int, refused *atomic.Uint64) *perAddrListener {
	return &perAddrListener{Listener: ln, max: max, refused: refused, conns: make(map[netip.Addr]int)}
}

// Accept returns the next connection whose address holds fewer than max, closing those
// it refuses on the way.
func (l *perAddrListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		a := clientAddr(c.RemoteAddr())
		l.mu.Lock()
		if l.conns[a] >= l.max {
			l.mu.Unlock()
			l.refused.Add(1)
			_ = c.Close()
			continue
		}
		l.conns[a]++
		l.mu.Unlock()
		return &addrConn{Conn: c, l: l, addr: a}, nil
	}
}

func (l *perAddrListener) release(a netip.Addr) {
	l.mu.Lock()
	if l.conns[a]--; l.conns[a] <= 0 {
		delete(l.conns, a)
	}
	l.mu.Unlock()
}

// clientAddr is the address a connection counts under: its peer's IP, IPv6 by /64.
func clientAddr(a net.Addr) netip.Addr {
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return netip.Addr{}
	}
	ip := ap.Addr().Unmap()
	if ip.Is6() {
		if p, err := ip.Prefix(64); err == nil {
			return p.Addr()
		}
	}
	return ip
}

// addrConn gives its address's slot back once, when closed.
type addrConn struct {
	net.Conn
	l    *perAddrListener
	addr netip.Addr
	once sync.Once
}

func (c *addrConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.release(c.addr) })
	return err
}
