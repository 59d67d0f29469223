package main

import (
	"regexp"
	"testing"
	"time"

	"github.com/streamlimit/streamlimit/internal/testenv"
)

// anyPort is the listen address the tests give the commands: port 0 on loopback. The
// system chooses a free port as the command binds it, so that nothing else on the machine
// can take it between a choice and the bind, as it could a port probed free beforehand;
// the command prints the port it got (serve reads it).
const anyPort = "127.0.0.1:0"

// listening matches the line a server command prints once its listeners are bound: the
// enforcer's "enforcer site eu: http 127.0.0.1:8081, grpc off, proxy 127.0.0.1:8080 → ..."
// and the aggregator's "aggregator: admin 127.0.0.1:9090".
var listening = regexp.MustCompile(`(?m)^(?:enforcer site \S+|aggregator): .*$`)

// listenerAddr matches one listener of such a line: its name and its address.
var listenerAddr = regexp.MustCompile(`\b(http|grpc|rlqs|proxy|admin) ([^\s,]+:\d+)`)

// served is a command running in process until the test ends.
type served struct {
	// out returns everything the command printed so far.
	out func() string
	// addrs holds the address of each listener by name: http, grpc, rlqs and proxy
	// (enforcer), admin (aggregator).
	addrs map[string]string
}

// serve runs the streamlimit command args in process until the test ends (startCommand),
// and waits until it has printed the addresses it listens on. Give its listen flags
// anyPort.
func serve(t *testing.T, args ...string) served {
	t.Helper()
	s := served{out: startCommand(t, args...)}
	s.addrs = waitAddrs(t, args[0], s.out)
	return s
}

// waitAddrs waits until a command named name has printed the addresses it listens on (out
// returns what it printed so far), and returns them by listener name.
func waitAddrs(t *testing.T, name string, out func() string) map[string]string {
	t.Helper()
	var line string
	testenv.Eventually(t, 60*time.Second, name+" printing its addresses", func() bool {
		line = listening.FindString(out())
		return line != ""
	})
	addrs := map[string]string{}
	for _, m := range listenerAddr.FindAllStringSubmatch(line, -1) {
		addrs[m[1]] = m[2]
	}
	return addrs
}

// addr returns the address of the listener called name, failing the test when the
// command did not name one.
func (s served) addr(t *testing.T, name string) string {
	t.Helper()
	a, ok := s.addrs[name]
	if !ok {
		t.Fatalf("the command named no %s listener: %q", name, listening.FindString(s.out()))
	}
	return a
}
