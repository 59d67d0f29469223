package testenv

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// echoServer answers each line with the same line until the test ends.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().String()
}

// echo sends a line over c and reads it back.
func echo(c net.Conn) error {
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, "ping\n"); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if line != "ping\n" {
		return fmt.Errorf("echoed %q", line)
	}
	return nil
}

func dialEcho(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	return echo(c)
}

// TestLink: a link bound before its upstream exists refuses connections, forwards once
// given one, and keeps its address through a cut: open connections end, new ones are
// reset, and Heal serves again on the same address.
func TestLink(t *testing.T) {
	l := NewLink(t, "a->b", "")
	if err := dialEcho(l.Addr()); err == nil {
		t.Fatal("a link without upstream forwarded")
	}
	l.SetUpstream(echoServer(t))
	if err := l.SetLatency(5*time.Millisecond, 0); err != nil {
		t.Fatal(err)
	}
	open, err := net.Dial("tcp", l.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	if err := echo(open); err != nil {
		t.Fatalf("through the link: %v", err)
	}

	l.Cut()
	if err := echo(open); err == nil {
		t.Error("a connection open across the cut still works")
	}
	if err := dialEcho(l.Addr()); err == nil {
		t.Error("a new connection works across the cut")
	}
	// The port is still the link's.
	if ln, err := net.Listen("tcp", l.Addr()); err == nil {
		ln.Close()
		t.Errorf("%s was free while the link was cut", l.Addr())
	}

	l.Heal()
	if err := dialEcho(l.Addr()); err != nil {
		t.Errorf("after Heal: %v", err)
	}
}

// TestRunKafkaStart: a start that failed to bind is stopped and retried after choosing
// again; any other failure, and the last attempt's, ends it.
func TestRunKafkaStart(t *testing.T) {
	bind := errors.New("kafka.sh start: exit status 1\nkafka.sh: the Kafka process exited: a port was taken: Socket server failed to bind to 127.0.0.1:1: Address already in use.")
	for _, c := range []struct {
		name     string
		fails    []error
		want     string // the calls made, in order
		wantAddr string
	}{
		{"first", nil, "choose start ", "127.0.0.1:9"},
		{"bind then up", []error{bind}, "choose start stop choose start ", "127.0.0.1:9"},
		{"other failure", []error{errors.New("no java")}, "choose start ", ""},
		{"bind every time", []error{bind, bind, bind}, "choose start stop choose start stop choose start ", ""},
	} {
		var calls strings.Builder
		starts := 0
		run := func(args ...string) (string, error) {
			calls.WriteString(args[0] + " ")
			if args[0] != "start" {
				return "", nil
			}
			starts++
			if starts <= len(c.fails) {
				return "", c.fails[starts-1]
			}
			return "127.0.0.1:9", nil
		}
		choose := func() error { calls.WriteString("choose "); return nil }
		addr, err := runKafkaStart(t.Logf, run, choose, 3)
		if calls.String() != c.want || addr != c.wantAddr || (err == nil) != (c.wantAddr != "") {
			t.Errorf("%s: calls %q, addr %q, err %v; want calls %q, addr %q", c.name, calls.String(), addr, err, c.want, c.wantAddr)
		}
	}
}
