package testenv

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// RedisServerOptions shapes a RedisServer.
type RedisServerOptions struct {
	// Config is a configuration file, passed before every argument as redis-server
	// requires (a Sentinel needs one it can rewrite).
	Config string
	// Args returns more arguments for the port and the data directory of one start. They
	// follow the defaults (loopback, no persistence) and so override them. Ports the
	// server needs besides its own (a cluster's bus port) are chosen here, so that a start
	// that finds one taken chooses again.
	Args func(port int, dir string) []string
	// Ready reports whether the server at addr serves. Nil sends PING in plain text, any
	// answer but LOADING counting (a server that wants a password is up).
	Ready func(addr string) bool
}

// RedisServer is a redis-server of one test's own on loopback, for tests that kill or
// pause Redis, or run it as a cluster, replica or Sentinel. A start that fails (a port
// taken between choosing it and binding it, by anything else on the machine) is retried
// on other ports, with redis-server's own words in the test log.
type RedisServer struct {
	t      testing.TB
	opts   RedisServerOptions
	port   int
	cmd    *exec.Cmd
	exited chan error
}

// redisStartAttempts bounds the ports one StartRedisServer tries.
const redisStartAttempts = 4

// StartRedisServer starts a redis-server and waits until it serves; it is killed when
// the test ends. Without redis-server the test ends with Unavailable.
func StartRedisServer(t testing.TB, o RedisServerOptions) *RedisServer {
	t.Helper()
	RealParts(t)
	Tool(t, "redis-server", "apt-get install redis-server (tests kill, pause and cluster their own Redis)")
	r := &RedisServer{t: t, opts: o}
	t.Cleanup(r.Kill)
	for attempt := 1; ; attempt++ {
		// Probed, not held: redis-server must be told its port, and reports no port it
		// chose; a start that finds it taken is retried here.
		r.port = FreePort(t)
		err := r.start()
		if err == nil {
			return r
		}
		if attempt == redisStartAttempts {
			t.Fatalf("redis-server did not start in %d attempts; the last: %v", attempt, err)
		}
		t.Logf("redis-server on port %d: %v; trying another port", r.port, err)
	}
}

// Addr is the server's host:port.
func (r *RedisServer) Addr() string { return "127.0.0.1:" + strconv.Itoa(r.port) }

// Port is the server's port.
func (r *RedisServer) Port() int { return r.port }

// Kill stops the server with SIGKILL, a crash rather than a shutdown. Its data is lost.
func (r *RedisServer) Kill() {
	if r.cmd == nil {
		return
	}
	_ = r.cmd.Process.Kill()
	<-r.exited
	r.cmd = nil
}

// Restart starts a killed server again on the same port, empty. The port was the
// server's a moment ago, so a failure is retried on it for a few seconds.
func (r *RedisServer) Restart() {
	r.t.Helper()
	r.Kill()
	var err error
	for attempt := 1; attempt <= redisStartAttempts; attempt++ {
		if err = r.start(); err == nil {
			return
		}
		time.Sleep(time.Duration(attempt) * 250 * time.Millisecond)
	}
	r.t.Fatalf("redis-server did not start again on port %d: %v", r.port, err)
}

// Signal sends sig to the server: SIGSTOP and SIGCONT pause and resume it.
func (r *RedisServer) Signal(sig os.Signal) error {
	if r.cmd == nil {
		return errors.New("redis-server is not running")
	}
	return r.cmd.Process.Signal(sig)
}

// start runs the server on r.port with a fresh data directory and waits until it is
// ready, or until it exits or 20 s pass; the error then carries the end of its output.
func (r *RedisServer) start() error {
	dir := r.t.TempDir()
	var args []string
	if r.opts.Config != "" {
		args = append(args, r.opts.Config)
	}
	args = append(args, "--port", strconv.Itoa(r.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir)
	if r.opts.Args != nil {
		args = append(args, r.opts.Args(r.port, dir)...)
	}
	out := &SyncBuffer{}
	cmd := exec.Command("redis-server", args...)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting redis-server: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	ready := r.opts.Ready
	if ready == nil {
		ready = pingReady
	}
	for deadline := time.Now().Add(20 * time.Second); ; {
		select {
		case err := <-exited:
			return fmt.Errorf("redis-server exited (%v): %s", err, lastLines(out.String(), 5))
		default:
		}
		if ready(r.Addr()) {
			r.cmd, r.exited = cmd, exited
			return nil
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			<-exited
			return fmt.Errorf("redis-server did not serve within 20 s: %s", lastLines(out.String(), 5))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// pingReady sends PING over plain TCP: a raw exchange, so that waiting for a server
// does not fill the test log with a client library's dial errors.
func pingReady(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return false
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return err == nil && !strings.HasPrefix(line, "-LOADING")
}

// lastLines returns the last n lines of s, on one line.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}
