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

// TestMirrorConfigFor generalises a two-cluster file to three: every ordered pair gets the
// file's flow settings, the new cluster a bootstrap line, and the rest stays.
func TestMirrorConfigFor(t *testing.T) {
	src := "# head\nclusters = eu, us\neu.bootstrap.servers = kafka-eu:9092\nus.bootstrap.servers = kafka-us:9092\n\neu->us.enabled = true\neu->us.topics = hits\nus->eu.enabled = true\nus->eu.topics = hits\n\nreplication.factor = 1\n"
	got, err := MirrorConfigFor([]byte(src), []string{"eu", "us", "ap"})
	if err != nil {
		t.Fatal(err)
	}
	want := "# head\nclusters = eu, us, ap\neu.bootstrap.servers = kafka-eu:9092\nus.bootstrap.servers = kafka-us:9092\nap.bootstrap.servers = kafka-ap:9092\n\n" +
		"eu->us.enabled = true\neu->us.topics = hits\neu->ap.enabled = true\neu->ap.topics = hits\n" +
		"us->eu.enabled = true\nus->eu.topics = hits\nus->ap.enabled = true\nus->ap.topics = hits\n" +
		"ap->eu.enabled = true\nap->eu.topics = hits\nap->us.enabled = true\nap->us.topics = hits\n\nreplication.factor = 1\n"
	if string(got) != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	// Two of the file's clusters give the file's own flows back.
	if got, err := MirrorConfigFor([]byte(src), []string{"eu", "us"}); err != nil || string(got) != src {
		t.Errorf("the file's own clusters: err %v, got\n%s\nwant\n%s", err, got, src)
	}
	for name, bad := range map[string]string{
		"flows differ": strings.Replace(src, "us->eu.topics = hits", "us->eu.topics = hits|counts", 1),
		"flow missing": strings.Replace(src, "us->eu.topics = hits\n", "", 1),
		"no flows":     "clusters = eu, us\neu.bootstrap.servers = a:1\n",
		"no bootstrap": "clusters = eu, us\neu->us.enabled = true\n",
		"one cluster":  src,
	} {
		names := []string{"eu", "us", "ap"}
		if name == "one cluster" {
			names = names[:1]
		}
		if _, err := MirrorConfigFor([]byte(bad), names); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	// The repository's file, which compose.yaml runs with two data centers, for three.
	path := RepoPath(t, filepath.Join("deploy", "mm2.properties"))
	repo, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	three, err := MirrorConfigFor(repo, []string{"eu", "us", "ap"})
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if _, err := OverrideBootstrap(three, map[string]string{"eu": "a:1", "us": "b:2", "ap": "c:3"}); err != nil {
		t.Errorf("%s for three clusters: %v", path, err)
	}
	for _, line := range []string{"clusters = eu, us, ap", "ap->us.topics = hits", "eu->ap.enabled = true"} {
		if !strings.Contains(string(three), line+"\n") {
			t.Errorf("%s for three clusters lacks %q:\n%s", path, line, three)
		}
	}
}
