package testenv

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestOverrideBootstrap(t *testing.T) {
	src := "clusters = eu, us\n# eu.bootstrap.servers is set below\neu.bootstrap.servers = kafka-eu:9092\nus.bootstrap.servers=kafka-us:9092\neu->us.enabled = true\n"
	got, err := OverrideBootstrap([]byte(src), map[string]string{"eu": "127.0.0.1:1", "us": "127.0.0.1:2"})
	if err != nil {
		t.Fatal(err)
	}
	want := "clusters = eu, us\n# eu.bootstrap.servers is set below\neu.bootstrap.servers = 127.0.0.1:1\nus.bootstrap.servers = 127.0.0.1:2\neu->us.enabled = true\n"
	if string(got) != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	if _, err := OverrideBootstrap([]byte(src), map[string]string{"ap": "127.0.0.1:3"}); err == nil || !strings.Contains(err.Error(), "ap.bootstrap.servers") {
		t.Errorf("an alias the file lacks: err = %v, want one naming ap.bootstrap.servers", err)
	}
}

// TestRepoMirrorConfig checks that the MirrorMaker file compose.yaml and the e2e tests
// share configures both data centers the tests override.
func TestRepoMirrorConfig(t *testing.T) {
	path := RepoPath(t, filepath.Join("deploy", "mm2.properties"))
	src, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := OverrideBootstrap(src, map[string]string{"eu": "a:1", "us": "b:2"}); err != nil {
		t.Errorf("%s: %v", path, err)
	}
}
