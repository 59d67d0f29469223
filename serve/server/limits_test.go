package server_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/streamlimit/streamlimit/serve/server"
)

// startServer runs a Kafka-less enforcer with cfg's limits and security on loopback and
// stops it at the end of the test.
func startServer(t testing.TB, cfg server.Config) *server.Server {
	t.Helper()
	cfg.Site, cfg.Rules = "eu", writeRules(t)
	if cfg.HTTPAddr == "" {
		cfg.HTTPAddr = "127.0.0.1:0"
	}
	if cfg.GRPCAddr == "" {
		cfg.GRPCAddr = "off"
	}
	return runServer(t, cfg)
}

// runServer runs a server of cfg until the test ends, and then checks that it stopped
// cleanly.
func runServer(t testing.TB, cfg server.Config) *server.Server {
	t.Helper()
	srv, err := server.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return srv
}

// closedWithin reports whether the server closes c within d (reading and discarding
// whatever it answers first).
func closedWithin(c net.Conn, d time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(d))
	_, err := io.Copy(io.Discard, c)
	var ne net.Error
	return !(errors.As(err, &ne) && ne.Timeout())
}

const checkBody = `{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"1"}]}]}`

// A client that sends its body a byte at a time, or keeps a connection idle, is cut off
// by the read and idle timeouts instead of holding the connection for as long as it likes.
func TestSlowAndIdleClientsAreCutOff(t *testing.T) {
	srv := startServer(t, server.Config{Limits: server.Limits{ReadTimeout: 500 * time.Millisecond, IdleTimeout: 500 * time.Millisecond}})

	t.Run("body at 1 byte per 100ms", func(t *testing.T) {
		c, err := net.Dial("tcp", srv.HTTPAddr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", len(checkBody))
		stop := make(chan struct{})
		defer close(stop)
		go func() { // keeps sending, as the slow client would, until the test ends
			for i := 0; i < len(checkBody); i++ {
				select {
				case <-stop:
					return
				case <-time.After(100 * time.Millisecond):
				}
				if _, err := c.Write([]byte{checkBody[i]}); err != nil {
					return
				}
			}
		}()
		// The whole body takes 7 s; the read timeout ends it after 0.5 s.
		if !closedWithin(c, 5*time.Second) {
			t.Fatal("a body sent at 1 byte per 100ms held its connection for 5 s")
		}
	})
	t.Run("idle keep-alive", func(t *testing.T) {
		c, err := net.Dial("tcp", srv.HTTPAddr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("healthz: %v %v", resp, err)
		}
		resp.Body.Close()
		if !closedWithin(c, 5*time.Second) {
			t.Fatal("an idle keep-alive connection was held for 5 s")
		}
	})
	t.Run("header block over MaxHeaderBytes", func(t *testing.T) {
		req, _ := http.NewRequest("GET", "http://"+srv.HTTPAddr()+"/healthz", nil)
		req.Header.Set("X-Big", strings.Repeat("a", 2*server.DefaultMaxHeaderBytes))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
			t.Fatalf("status %d, want 431", resp.StatusCode)
		}
	})
}

// With MaxConns connections held open, the next client is not served until one closes.
func TestMaxConnsPerListener(t *testing.T) {
	srv := startServer(t, server.Config{Limits: server.Limits{MaxConns: 2}})
	var held []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", srv.HTTPAddr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		held = append(held, c)
	}
	c, err := net.Dial("tcp", srv.HTTPAddr()) // the kernel accepts; the server does not
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
	_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("a third connection was served while two were held")
	}
	held[0].Close()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("third connection after one closed: %v %v", resp, err)
	}
	resp.Body.Close()
}

// The gRPC server announces its stream bound in its HTTP/2 settings and disconnects a
// client that pings more often than the keepalive policy allows.
func TestGRPCStreamsAndKeepalive(t *testing.T) {
	srv := startServer(t, server.Config{GRPCAddr: "127.0.0.1:0", Limits: server.Limits{GRPCMaxStreams: 7}})
	c, err := net.Dial("tcp", srv.GRPCAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(c, c)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	var streams uint32
	var pinged, goaway bool
	for !goaway {
		f, err := fr.ReadFrame()
		if err != nil {
			break
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if v, ok := f.Value(http2.SettingMaxConcurrentStreams); ok {
				streams = v
			}
			if !f.IsAck() {
				_ = fr.WriteSettingsAck()
			}
			if !pinged {
				// A ping burst with no call open: far more often than every 10 s.
				for i := range 10 {
					_ = fr.WritePing(false, [8]byte{byte(i)})
				}
				pinged = true
			}
		case *http2.GoAwayFrame:
			goaway = f.ErrCode == http2.ErrCodeEnhanceYourCalm
			if !goaway {
				t.Fatalf("GOAWAY %v %q, want ENHANCE_YOUR_CALM (too many pings)", f.ErrCode, f.DebugData())
			}
		}
	}
	if streams != 7 {
		t.Errorf("SETTINGS_MAX_CONCURRENT_STREAMS %d, want 7", streams)
	}
	if !goaway {
		t.Error("a client pinging 10 times at once was not sent away")
	}
}

func TestLimitsDefaults(t *testing.T) {
	l := server.DefaultLimits()
	if l.ReadTimeout != server.DefaultReadTimeout || l.MaxConns != server.DefaultMaxConns || l.GRPCMaxStreams != server.DefaultGRPCMaxStreams || l.MaxBodyBytes <= 0 {
		t.Fatalf("DefaultLimits() = %+v", l)
	}
}
