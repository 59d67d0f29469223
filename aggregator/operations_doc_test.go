package aggregator

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// docs/operations.md's "Watching it" names the aggregator's metrics and log messages: every
// metric it names is one an Aggregator registers, and every log message is one this package
// logs.
func TestOperationsDocMetricsAndLogs(t *testing.T) {
	b, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	reg := prometheus.NewRegistry()
	if _, err := New(Config{Brokers: []string{"localhost:9092"}, Registerer: reg}); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	registered := map[string]bool{}
	for _, mf := range mfs {
		registered[mf.GetName()] = true
	}
	// The lag gauge has no series until a partition is assigned.
	registered["streamlimit_aggregator_consume_lag_records"] = true
	// Nor the clock offset gauge until a hits topic's sites are estimated.
	registered["streamlimit_aggregator_clock_offset_seconds"] = true
	names := regexp.MustCompile(`streamlimit_aggregator_[a-z_]+`).FindAllString(doc, -1)
	if len(names) == 0 {
		t.Fatal("no aggregator metric named in docs/operations.md")
	}
	for _, n := range names {
		if !registered[n] {
			t.Errorf("docs/operations.md names %s, which the aggregator does not register", n)
		}
	}

	var src strings.Builder
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		src.Write(b)
	}
	_, watching, ok := strings.Cut(doc, "### Watching it")
	if !ok {
		t.Fatal(`docs/operations.md has no "Watching it" section`)
	}
	if i := strings.Index(watching, "\n#"); i >= 0 {
		watching = watching[:i] // up to the next heading: later tables are not of log messages
	}
	n := 0
	for _, line := range strings.Split(watching, "\n") {
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if !strings.HasPrefix(line, "| `") || len(cells) < 2 {
			continue
		}
		for _, m := range regexp.MustCompile("`([^`]+)`").FindAllStringSubmatch(cells[0], -1) {
			n++
			if !strings.Contains(src.String(), `"`+m[1]) {
				t.Errorf("docs/operations.md names the log message %q, which the aggregator does not log", m[1])
			}
		}
	}
	if n == 0 {
		t.Fatal("no log message named in docs/operations.md")
	}
}
