// Command slowclients measures how long an enforcer's HTTP API lets careless or hostile
// clients hold connections: it starts a Kafka-less enforcer in process (with the default
// server limits, or none with -unbounded), opens -n connections of each kind (idle,
// half-headers, slow-body at 1 byte a second, keepalive), prints at every -every how many
// of each the server still holds, and at the end how long it held each kind.
//
//	go run ./bench/slowclients -n 1000 -for 75s [-unbounded]
//
// docs/hardening.md has the figures.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/streamlimit/streamlimit"
	"github.com/streamlimit/streamlimit/serve/server"
)

func main() {
	n := flag.Int("n", 500, "connections of each kind")
	dur := flag.Duration("for", 75*time.Second, "how long to watch")
	every := flag.Duration("every", 5*time.Second, "how often to print")
	unbounded := flag.Bool("unbounded", false, "serve as before the limits: a 10 s header timeout only, no connection bound")
	flag.Parse()
	if err := run(*n, *dur, *every, *unbounded); err != nil {
		fmt.Fprintln(os.Stderr, "slowclients:", err)
		os.Exit(1)
	}
}

var kinds = []string{"idle", "half-headers", "slow-body", "keepalive"}

func run(n int, dur, every time.Duration, unbounded bool) error {
	dir, err := os.MkdirTemp("", "slowclients")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	rules := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(rules, []byte("domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 1000000, scope: local}\n"), 0o600); err != nil {
		return err
	}
	lim := server.Limits{}
	if unbounded {
		lim = server.Limits{ReadHeaderTimeout: 10 * time.Second, ReadTimeout: -1, WriteTimeout: -1, IdleTimeout: -1, MaxConns: -1}
	}
	srv, err := server.New(server.Config{
		Config:   streamlimit.Config{Site: "bench", Rules: rules, Logger: slog.New(slog.DiscardHandler)},
		HTTPAddr: "127.0.0.1:0",
		GRPCAddr: "off",
		Limits:   lim,
	})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = srv.Run(ctx) }()
	addr := srv.HTTPAddr()

	open := make([]atomic.Int64, len(kinds))
	held := make([][]time.Duration, len(kinds))
	var heldMu sync.Mutex
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var conns []net.Conn
	for k := range kinds {
		for range n {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				return fmt.Errorf("dial (%s): %w", kinds[k], err)
			}
			conns = append(conns, c)
			opened := time.Now()
			if err := start(k, c); err != nil {
				return fmt.Errorf("%s: %w", kinds[k], err)
			}
			open[k].Add(1)
			wg.Add(1)
			go func() {
				defer wg.Done()
				if watch(k, c, stop) {
					heldMu.Lock()
					held[k] = append(held[k], time.Since(opened))
					heldMu.Unlock()
				}
				open[k].Add(-1)
			}()
		}
	}
	fmt.Printf("limits: %s; %d connections of each kind\n", describe(unbounded), n)
	fmt.Printf("%8s", "after")
	for _, k := range kinds {
		fmt.Printf(" %13s", k)
	}
	fmt.Println()
	t0 := time.Now()
	for el := time.Duration(0); el <= dur; el += every {
		time.Sleep(time.Until(t0.Add(el)))
		fmt.Printf("%8s", el.Round(time.Second))
		for k := range kinds {
			fmt.Printf(" %13d", open[k].Load())
		}
		fmt.Println()
	}
	close(stop)
	for _, c := range conns {
		_ = c.Close()
	}
	wg.Wait()
	fmt.Printf("%-13s %8s %12s %12s %12s\n", "kind", "closed", "median held", "longest", "still open")
	for k := range kinds {
		d := held[k]
		slices.Sort(d)
		med, longest := time.Duration(0), time.Duration(0)
		if len(d) > 0 {
			med, longest = d[len(d)/2], d[len(d)-1]
		}
		fmt.Printf("%-13s %8d %12s %12s %12d\n", kinds[k], len(d), med.Round(100*time.Millisecond), longest.Round(100*time.Millisecond), n-len(d))
	}
	return nil
}

func describe(unbounded bool) string {
	if unbounded {
		return "unbounded (10 s header timeout only)"
	}
	l := server.DefaultLimits()
	return fmt.Sprintf("defaults (header %v, read %v, idle %v, %d connections)", l.ReadHeaderTimeout, l.ReadTimeout, l.IdleTimeout, l.MaxConns)
}

const bodyLen = 1024

// start sends what a client of kind k sends first.
func start(k int, c net.Conn) error {
	switch kinds[k] {
	case "half-headers":
		_, err := io.WriteString(c, "POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Ty")
		return err
	case "slow-body":
		_, err := fmt.Fprintf(c, "POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", bodyLen)
		return err
	case "keepalive":
		if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			return err
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return err
		}
		return resp.Body.Close()
	}
	return nil
}

// watch returns when the server closes c, true, or when stop is closed, false; a
// slow-body client keeps sending a byte a second meanwhile.
func watch(k int, c net.Conn, stop <-chan struct{}) bool {
	if kinds[k] == "slow-body" {
		go func() {
			t := time.NewTicker(time.Second)
			defer t.Stop()
			for range bodyLen {
				select {
				case <-stop:
					return
				case <-t.C:
				}
				if _, err := c.Write([]byte{' '}); err != nil {
					return
				}
			}
		}()
	}
	_, _ = io.Copy(io.Discard, c)
	select {
	case <-stop:
		return false
	default:
		return true
	}
}
