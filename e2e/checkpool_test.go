package e2e_test

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"
)

// checkPool sends check requests to enforcers over keep-alive connections of its own, one
// idle list per address, with a minimal HTTP/1.1 exchange instead of net/http's client.
// The multi-cluster test sends a few hundred requests a second from a test binary built
// with the race detector, on a machine that also runs its brokers, MirrorMakers and
// enforcers: net/http's transport (two goroutines and several channels per connection and
// request) cost more CPU there than everything it measured, and slowed the pipeline it
// measured. Only what the check API answers is read: the status, Content-Length and the
// body, whose overall code and fallback marks the enforcer writes in a fixed form
// (httplimit's appendCheckResponse).
type checkPool struct {
	mu   sync.Mutex
	idle map[string][]*checkConn
}

type checkConn struct {
	c   net.Conn
	r   *bufio.Reader
	req []byte
}

func newCheckPool() *checkPool { return &checkPool{idle: map[string][]*checkConn{}} }

// close closes every idle connection.
func (p *checkPool) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, cs := range p.idle {
		for _, c := range cs {
			c.c.Close()
		}
	}
	p.idle = map[string][]*checkConn{}
}

func (p *checkPool) get(addr string) *checkConn {
	p.mu.Lock()
	defer p.mu.Unlock()
	cs := p.idle[addr]
	if len(cs) == 0 {
		return nil
	}
	c := cs[len(cs)-1]
	p.idle[addr] = cs[:len(cs)-1]
	return c
}

func (p *checkPool) put(addr string, c *checkConn) {
	p.mu.Lock()
	p.idle[addr] = append(p.idle[addr], c)
	p.mu.Unlock()
}

// check posts body to addr's /v1/check and returns the HTTP status, whether the answer
// admits the request (overall code OK) and whether any of its statuses is marked fallback.
// A request on a kept connection that the server had closed (an enforcer stopping) is sent
// again once on a new connection: nothing of it was answered.
func (p *checkPool) check(addr string, body []byte) (status int, admitted, fallback bool, err error) {
	for attempt := 0; ; attempt++ {
		c := p.get(addr)
		reused := c != nil
		if c == nil {
			nc, err := net.DialTimeout("tcp", addr, 10*time.Second)
			if err != nil {
				return 0, false, false, err
			}
			c = &checkConn{c: nc, r: bufio.NewReaderSize(nc, 4096)}
		}
		var keep, answered bool
		status, admitted, fallback, keep, answered, err = c.exchange(addr, body)
		if err == nil {
			if keep {
				p.put(addr, c)
			} else {
				c.c.Close()
			}
			return status, admitted, fallback, nil
		}
		c.c.Close()
		if !reused || answered || attempt > 0 {
			return 0, false, false, err
		}
	}
}

var (
	admittedPrefix = []byte(`{"overall_code":"OK"`)
	fallbackMark   = []byte(`"fallback":true`)
)

// exchange sends one request and reads its answer. answered says whether any byte of the
// answer came.
func (c *checkConn) exchange(addr string, body []byte) (status int, admitted, fallback, keep, answered bool, err error) {
	if err := c.c.SetDeadline(time.Now().Add(30 * time.Second)); err != nil {
		return 0, false, false, false, false, err
	}
	c.req = fmt.Appendf(c.req[:0], "POST /v1/check HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", addr, len(body))
	c.req = append(c.req, body...)
	if _, err := c.c.Write(c.req); err != nil {
		return 0, false, false, false, false, err
	}
	line, err := c.r.ReadSlice('\n')
	if err != nil {
		return 0, false, false, false, len(line) > 0, err
	}
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.1 ")) {
		return 0, false, false, false, true, fmt.Errorf("status line %q", line)
	}
	if status, err = strconv.Atoi(string(line[9:12])); err != nil {
		return 0, false, false, false, true, fmt.Errorf("status line %q", line)
	}
	n, keep := -1, true
	for {
		h, err := c.r.ReadSlice('\n')
		if err != nil {
			return 0, false, false, false, true, err
		}
		h = bytes.TrimRight(h, "\r\n")
		if len(h) == 0 {
			break
		}
		name, value, _ := bytes.Cut(h, []byte(":"))
		value = bytes.TrimSpace(value)
		switch {
		case bytes.EqualFold(name, []byte("Content-Length")):
			if n, err = strconv.Atoi(string(value)); err != nil {
				return 0, false, false, false, true, fmt.Errorf("content length %q", value)
			}
		case bytes.EqualFold(name, []byte("Connection")) && bytes.EqualFold(value, []byte("close")):
			keep = false
		}
	}
	if n < 0 || n > c.r.Size() {
		return 0, false, false, false, true, fmt.Errorf("an answer of %d bytes: no Content-Length, or larger than a check answer of one descriptor", n)
	}
	resp, err := c.r.Peek(n)
	if err != nil {
		return 0, false, false, false, true, err
	}
	admitted = bytes.HasPrefix(resp, admittedPrefix)
	fallback = bytes.Contains(resp, fallbackMark)
	if _, err := c.r.Discard(n); err != nil {
		return 0, false, false, false, true, err
	}
	return status, admitted, fallback, keep, true, nil
}
