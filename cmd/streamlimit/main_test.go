package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/streamlimit/streamlimit/internal/testenv"
)

// run executes the CLI with args and returns its stdout and error.
func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := newRootCmd()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(context.Background())
	return out.String(), err
}

func TestVersion(t *testing.T) {
	out, err := run(t, "version")
	if err != nil || !strings.HasPrefix(out, "streamlimit ") {
		t.Fatalf("version: %q, %v", out, err)
	}
	flag, err := run(t, "--version")
	if err != nil || flag != out {
		t.Fatalf("--version: %q, %v; want what version prints, %q", flag, err, out)
	}
}

func TestTopicsEnsure(t *testing.T) {
	brokers := testenv.Kafka(t)
	hits, counts := testenv.TopicName(t, "hits"), testenv.TopicName(t, "counts")
	args := []string{"topics", "ensure", "--brokers", brokers, "--hits-topic", hits, "--counts-topic", counts, "--partitions", "2", "--counts-partitions", "2"}
	out, err := run(t, args...)
	if err != nil {
		t.Fatalf("first ensure: %v\n%s", err, out)
	}
	if !strings.Contains(out, "created  "+hits) || !strings.Contains(out, "created  "+counts) {
		t.Fatalf("first ensure output:\n%s", out)
	}
	out, err = run(t, args...)
	if err != nil || !strings.Contains(out, "verified "+counts) {
		t.Fatalf("second ensure: %v\n%s", err, out)
	}
	// Asking for another layout than the existing one is an error that says what differs.
	args[len(args)-3] = "4"
	_, err = run(t, args...)
	if err == nil || !strings.Contains(err.Error(), "partitions is 2, want 4") {
		t.Fatalf("mismatched partitions: %v", err)
	}
}
