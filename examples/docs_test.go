package examples

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/streamlimit/streamlimit/internal/testenv"
)

// TestDocsClientCommands holds docs/records.md's commands for the Python and Java clients
// to what TestClientsInOtherLanguages runs: the files they name exist (the classpath is
// the jars that e2e/services/kafka.sh fetches), and every flag they pass is one the
// client reads.
func TestDocsClientCommands(t *testing.T) {
	b, err := os.ReadFile("../docs/records.md")
	if err != nil {
		t.Fatal(err)
	}
	clients := map[string]string{"python3": "python/streamlimit_client.py", "java": "java/StreamlimitClient.java"}
	flag := regexp.MustCompile(`(?:^| )(--[a-z][a-z-]*)`)
	seen := map[string]bool{}
	for line := range strings.Lines(string(b)) {
		words := strings.Fields(line)
		if len(words) == 0 {
			continue
		}
		switch words[0] {
		case "pip":
			req := words[len(words)-1]
			if _, err := os.Stat(filepath.Join("..", req)); err != nil {
				t.Errorf("docs/records.md: %s: %v", strings.TrimSpace(line), err)
			}
			seen["pip"] = true
		case "python3", "java":
			if len(words) > 3 && words[0] == "python3" && words[1] == "-m" && words[2] == "venv" {
				// The virtual environment a new user makes first: it must be makeable here.
				t.Run("venv", func(t *testing.T) {
					testenv.RealParts(t) // runs python3
					if out, err := exec.Command("python3", "-m", "venv", filepath.Join(t.TempDir(), "venv")).CombinedOutput(); err != nil {
						t.Errorf("docs/records.md: %s: %v\n%s", strings.TrimSpace(line), err, out)
					}
				})
				if !strings.Contains(line, ". "+words[3]+"/bin/activate") {
					t.Errorf("docs/records.md: %q does not activate the environment it makes", strings.TrimSpace(line))
				}
				seen["venv"] = true
				continue
			}
			src := clients[words[0]]
			if !strings.Contains(line, "examples/"+src) {
				t.Errorf("docs/records.md: %q does not run examples/%s", strings.TrimSpace(line), src)
				continue
			}
			code, err := os.ReadFile(src)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range flag.FindAllStringSubmatch(line, -1) {
				if !strings.Contains(string(code), `"`+m[1]+`"`) {
					t.Errorf("docs/records.md passes %s to %s, which does not read it", m[1], src)
				}
			}
			if words[0] == "java" {
				sh, err := os.ReadFile("../e2e/services/kafka.sh")
				if err != nil {
					t.Fatal(err)
				}
				v := regexp.MustCompile(`VERSION=\$\{STREAMLIMIT_KAFKA_VERSION:-([0-9.]+)\}`).FindSubmatch(sh)
				if v == nil || !strings.Contains(line, "/kafka-"+string(v[1])+"/libs/*") {
					t.Errorf("docs/records.md's classpath is not the jars of the Kafka that e2e/services/kafka.sh fetches (%s)", v)
				}
			}
			seen[words[0]] = true
		}
	}
	if len(seen) != 4 {
		t.Errorf("docs/records.md's client commands: found %v, want venv, pip, python3 and java", seen)
	}
}
