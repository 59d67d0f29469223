package testenv

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// redis.sh listens on the port STREAMLIMIT_REDIS_PORT names (what `make services-up
// REDIS_PORT=…` sets), and the Makefile passes both pinned ports through.
func TestServicesFixedPorts(t *testing.T) {
	RealParts(t)
	Tool(t, "redis-server", "apt-get install redis-server")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	ln.Close()
	script := filepath.Join("..", "..", "e2e", "services", "redis.sh")
	env := append(os.Environ(), "STREAMLIMIT_RUN_DIR="+t.TempDir(), "STREAMLIMIT_REDIS_PORT="+port)
	start := exec.Command("bash", script, "start")
	start.Env = env
	out, err := start.Output()
	if err != nil {
		t.Fatalf("redis.sh start: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		stop := exec.Command("bash", script, "stop")
		stop.Env = env
		_ = stop.Run()
	})
	if got := strings.TrimSpace(string(out)); got != "127.0.0.1:"+port {
		t.Fatalf("redis.sh start printed %q, want 127.0.0.1:%s", got, port)
	}
	// A second instance on the same port is refused with a clear error.
	again := exec.Command("bash", script, "start", "other")
	again.Env = env
	if msg, err := again.CombinedOutput(); err == nil || !strings.Contains(string(msg), "taken") {
		t.Fatalf("a second redis on port %s: %v\n%s", port, err, msg)
	}
	dry, err := exec.Command("make", "-n", "-C", filepath.Join("..", ".."), "services-up", "KAFKA_PORT=19092", "REDIS_PORT=16379").Output()
	if err != nil {
		t.Fatalf("make -n services-up: %v", err)
	}
	for _, want := range []string{"STREAMLIMIT_KAFKA_PORT=19092", "STREAMLIMIT_REDIS_PORT=16379"} {
		if !strings.Contains(string(dry), want) {
			t.Errorf("make services-up does not pass %s:\n%s", want, dry)
		}
	}
}
