package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/streamlimit/streamlimit/internal/testenv"
)

// nginxApp is the application's address in the docs' nginx blocks.
const nginxApp = "127.0.0.1:9000"

// nginxWrap is the part of an nginx configuration that the docs leave to the reader's own
// (a process of its own, in a directory of the test's), around a block of the docs. Only
// the realip lines are the test's: nginx listens on a Unix socket, so that no port is
// probed, and takes the client's address from X-Test-Client, so that each block counts a
// client of its own.
const nginxWrap = `daemon off;
master_process off;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log warn;
events { worker_connections 64; }
http {
    access_log off;
    client_body_temp_path %[1]s/body;
    proxy_temp_path %[1]s/proxy;
    fastcgi_temp_path %[1]s/fastcgi;
    uwsgi_temp_path %[1]s/uwsgi;
    scgi_temp_path %[1]s/scgi;
    set_real_ip_from unix:;
    real_ip_header X-Test-Client;
%[2]s
}
`

// TestNginxBlocksInRealNginx runs the nginx blocks of the README and of docs/api.md in a
// real nginx, as a reader pastes them: the README's locations inside a server of their
// own, docs/api.md's whole server; only the application's and the enforcer's addresses
// and the listen line are rewritten. Each passes `nginx -t`, and through it a client of
// the README's rule (two a minute per client address) gets the application twice, then a
// 429 with Retry-After and nothing from the application; docs/api.md's block also copies
// the rate-limit fields onto both answers and gives the 429 its JSON body.
func TestNginxBlocksInRealNginx(t *testing.T) {
	nginx := testenv.Tool(t, "nginx", "apt-get install nginx-light (examples/install-test-tools.sh)")
	dir := t.TempDir()
	rules := filepath.Join(dir, "http.yaml")
	if err := os.WriteFile(rules, []byte("domain: http\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: minute, requests_per_unit: 2}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	enforcer := serve(t, "enforcer", "--no-kafka", "--default-share", "1", "--site", "eu", "--rules", rules,
		"--http-listen", anyPort, "--grpc-listen", "off", "--log-level", "warn",
		"--redis-key-prefix", fmt.Sprintf("nginx-%d:", time.Now().UnixNano())).addr(t, "http")
	var appHits atomic.Int64
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		appHits.Add(1)
		io.WriteString(w, "the application\n")
	}))
	defer app.Close()

	for i, doc := range []struct {
		file, title string
		fields      bool // the block copies every rate-limit field, and gives the 429 a body
	}{
		{"../../README.md", "### nginx (`auth_request`)", false},
		{"../../docs/api.md", "## nginx in front, streamlimit deciding (`auth_request`)", true},
	} {
		t.Run(filepath.Base(doc.file), func(t *testing.T) {
			_, blk, ok := strings.Cut(docSection(t, doc.file, doc.title), "```nginx\n")
			if !ok {
				t.Fatal("no nginx block")
			}
			blk, _, _ = strings.Cut(blk, "```")
			run := t.TempDir()
			sock := filepath.Join(run, "nginx.sock")
			if !strings.Contains(blk, "server {") {
				blk = "server {\n    listen 80;\n" + blk + "}\n"
			}
			for _, r := range []struct{ from, to string }{
				{"listen 80;", "listen unix:" + sock + ";"},
				{nginxApp, strings.TrimPrefix(app.URL, "http://")},
				{readmeHTTP, enforcer},
			} {
				if !strings.Contains(blk, r.from) {
					t.Fatalf("the block has no %q to rewrite:\n%s", r.from, blk)
				}
				blk = strings.ReplaceAll(blk, r.from, r.to)
			}
			conf := filepath.Join(run, "nginx.conf")
			if err := os.WriteFile(conf, fmt.Appendf(nil, nginxWrap, run, blk), 0o644); err != nil {
				t.Fatal(err)
			}
			if out, err := exec.Command(nginx, "-t", "-p", run, "-c", conf).CombinedOutput(); err != nil {
				t.Fatalf("nginx -t: %v\n%s", err, out)
			}
			ctx, cancel := context.WithCancel(context.Background())
			cmd := exec.CommandContext(ctx, nginx, "-p", run, "-c", conf)
			var logs strings.Builder
			cmd.Stdout, cmd.Stderr = &logs, &logs
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				cancel()
				_ = cmd.Wait()
				if t.Failed() {
					errLog, _ := os.ReadFile(filepath.Join(run, "error.log"))
					t.Logf("nginx output:\n%s\nerror.log:\n%s", logs.String(), errLog)
				}
			})
			client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
				DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
					return (&net.Dialer{}).DialContext(ctx, "unix", sock)
				},
			}}
			testenv.Eventually(t, 10*time.Second, "nginx listening", func() bool {
				_, err := os.Stat(sock)
				return err == nil
			})
			before := appHits.Load()
			for n, want := range []int{http.StatusOK, http.StatusOK, http.StatusTooManyRequests} {
				req, _ := http.NewRequest(http.MethodGet, "http://nginx/articles", nil)
				req.Header.Set("X-Test-Client", fmt.Sprintf("10.7.7.%d", i+1))
				resp, err := client.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != want {
					t.Fatalf("request %d: status %d, want %d\n%s", n+1, resp.StatusCode, want, body)
				}
				if want == http.StatusTooManyRequests && resp.Header.Get("Retry-After") == "" {
					t.Errorf("the 429 has no Retry-After: %v", resp.Header)
				}
				if !doc.fields {
					continue
				}
				for _, f := range []string{"RateLimit-Policy", "RateLimit", "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset"} {
					if resp.Header.Get(f) == "" {
						t.Errorf("request %d (%d): no %s: %v", n+1, resp.StatusCode, f, resp.Header)
					}
				}
				if want == http.StatusTooManyRequests && !strings.Contains(string(body), `"status":429`) {
					t.Errorf("the 429's body: %s", body)
				}
			}
			if got := appHits.Load() - before; got != 2 {
				t.Errorf("the application served %d requests, want the 2 admitted", got)
			}
		})
	}
}
