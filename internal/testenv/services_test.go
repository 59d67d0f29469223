package testenv

import (
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
	script := filepath.Join("..", "..", "e2e", "services", "redis.sh")
	var (
		port string
		env  []string
		out  []byte
	)
	// The test is of a port given in advance, so it is probed free (FreePort), and the
	// start retried on another when something took it in between.
	for attempt := 1; ; attempt++ {
		port = strconv.Itoa(FreePort(t))
		env = append(os.Environ(), "STREAMLIMIT_RUN_DIR="+t.TempDir(), "STREAMLIMIT_REDIS_PORT="+port)
		start := exec.Command("bash", script, "start")
		start.Env = env
		var stderr strings.Builder
		start.Stderr = &stderr
		var err error
		if out, err = start.Output(); err == nil {
			break
		}
		if !strings.Contains(stderr.String(), "is taken") || attempt == 4 {
			t.Fatalf("redis.sh start: %v\n%s%s", err, out, stderr.String())
		}
		t.Logf("port %s: %s; trying another", port, strings.TrimSpace(stderr.String()))
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
