package server

import (
	"io"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/streamlimit/streamlimit/internal/clientaddr"
	"github.com/streamlimit/streamlimit/serve/headers"
)

// perAddrListener holds at most max connections from one client address at once (IPv6
// grouped by /64, which one client commonly holds whole): a connection past that is
// refused as soon as it is accepted, so that one client, however many connections it opens
// and leaves silent, cannot take the listener's connections (Limits.MaxConns) from the
// others. The bound applies to the connection's peer: behind a proxy, that is the proxy.
//
// A refused connection of a plaintext HTTP listener (answerHTTP) is answered 503 once its
// client has sent something, then closed: a client that sent a request on it, such as a
// connection pool opening one more connection than the bound, gets an answer it can act
// on instead of the bare EOF of a connection closed under its request. Other listeners
// (gRPC, TLS, whose protocols start below HTTP/1.1) close it at once.
type perAddrListener struct {
	net.Listener
	max        int
	refused    *atomic.Uint64
	answerHTTP bool

	mu        sync.Mutex
	conns     map[netip.Addr]int
	answering map[net.Conn]struct{} // refused connections being answered
	closed    bool
	wg        sync.WaitGroup // the goroutines answering refused connections
}

// The bounds on answering refused connections, which a flood from one address makes
// many: each is answered by a goroutine of its own for at most refuseLinger, at most
// maxAnswering at once; one past that is closed at once.
const (
	refuseLinger = time.Second
	maxAnswering = 64
	// refuseDrainBytes bounds what is read of a refused connection's request.
	refuseDrainBytes = 64 << 10
)

// refusedProblem is the body of the 503 a refused HTTP connection is answered.
const refusedProblem = `{"type":"about:blank","title":"Service Unavailable","status":503,"detail":"this client address holds as many connections to this listener as it may (--max-conns-per-addr): send on one of them, or come back"}`

// refusedResponse returns the whole answer of a refused HTTP connection.
func refusedResponse() string {
	return "HTTP/1.1 503 Service Unavailable\r\n" +
		"Connection: close\r\n" +
		"Retry-After: 1\r\n" +
		"Content-Type: " + headers.ProblemContentType + "\r\n" +
		"Content-Length: " + strconv.Itoa(len(refusedProblem)) + "\r\n" +
		"\r\n" + refusedProblem
}

func newPerAddrListener(ln net.Listener, max int, refused *atomic.Uint64, answerHTTP bool) *perAddrListener {
	return &perAddrListener{Listener: ln, max: max, refused: refused, answerHTTP: answerHTTP,
		conns: make(map[netip.Addr]int), answering: make(map[net.Conn]struct{})}
}

// Accept returns the next connection whose address holds fewer than max, refusing those
// past it on the way.
func (l *perAddrListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		a := clientaddr.Of(c.RemoteAddr())
		l.mu.Lock()
		if l.conns[a] >= l.max {
			l.mu.Unlock()
			l.refused.Add(1)
			l.refuse(c)
			continue
		}
		l.conns[a]++
		l.mu.Unlock()
		return &addrConn{Conn: c, l: l, addr: a}, nil
	}
}

// refuse closes c, or, on an HTTP listener with room to answer, answers it in the
// background.
func (l *perAddrListener) refuse(c net.Conn) {
	l.mu.Lock()
	if !l.answerHTTP || l.closed || len(l.answering) >= maxAnswering {
		l.mu.Unlock()
		_ = c.Close()
		return
	}
	l.answering[c] = struct{}{}
	l.wg.Add(1)
	l.mu.Unlock()
	go func() {
		defer l.wg.Done()
		answerRefused(c)
		l.mu.Lock()
		delete(l.answering, c)
		l.mu.Unlock()
	}()
}

// answerRefused answers c 503 and closes it, within refuseLinger (network deadlines, on
// the wall clock). The answer waits for the client's first bytes: an HTTP client takes
// bytes that arrive before it has sent its request for a broken connection, not for an
// answer. Then c's sending side is shut and what the client sends is read until it
// closes, before c is: closing a connection with unread data sends a reset, which can
// destroy the answer before the client has read it.
func answerRefused(c net.Conn) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(refuseLinger))
	var first [1]byte
	if _, err := c.Read(first[:]); err != nil {
		return // silent until the deadline, or gone: nothing to answer
	}
	if _, err := io.WriteString(c, refusedResponse()); err != nil {
		return
	}
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	_, _ = io.CopyN(io.Discard, c, refuseDrainBytes)
}

// Close closes the listener and ends the answers to refused connections still under way.
func (l *perAddrListener) Close() error {
	err := l.Listener.Close()
	l.mu.Lock()
	l.closed = true
	for c := range l.answering {
		_ = c.SetDeadline(time.Now()) // their goroutines return at once
	}
	l.mu.Unlock()
	l.wg.Wait()
	return err
}

func (l *perAddrListener) release(a netip.Addr) {
	l.mu.Lock()
	if l.conns[a]--; l.conns[a] <= 0 {
		delete(l.conns, a)
	}
	l.mu.Unlock()
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
