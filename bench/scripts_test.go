package bench

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/streamlimit/streamlimit/internal/testenv"
)

// TestBenchScripts: every bench script parses (bash -n), and every server that redis.sh
// asks serving.sh for, by default, is one serving.sh knows how to start, so that a renamed
// row is caught here and not at the end of a make bench.
func TestBenchScripts(t *testing.T) {
	scripts, err := filepath.Glob("*.sh")
	if err != nil || len(scripts) == 0 {
		t.Fatalf("no bench scripts: %v", err)
	}
	t.Run("bash -n", func(t *testing.T) {
		testenv.RealParts(t) // runs bash
		for _, s := range scripts {
			if out, err := exec.Command("bash", "-n", s).CombinedOutput(); err != nil {
				t.Errorf("%s: %v\n%s", s, err, out)
			}
		}
	})
	redis, err := os.ReadFile("redis.sh")
	if err != nil {
		t.Fatal(err)
	}
	serving, err := os.ReadFile("serving.sh")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`REDIS_SERVERS:-([^}]*)}`).FindSubmatch(redis)
	if m == nil {
		t.Fatal("redis.sh names no default servers")
	}
	for _, name := range strings.Fields(string(m[1])) {
		if !regexp.MustCompile(`(?m)^\s+(\S+ \| )*` + regexp.QuoteMeta(name) + `( \| \S+)*\)`).Match(serving) {
			t.Errorf("redis.sh asks for server %q, which serving.sh does not start", name)
		}
	}
}
