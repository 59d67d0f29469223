package main

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/crane"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/streamlimit/streamlimit/internal/testenv"
	"gopkg.in/yaml.v3"
)

const repoRoot = "../.."

// imageDocCommands returns the lines of the sh blocks of docs/operations.md's section on
// the image, without their comments, and whether each is marked as needing an external
// system (a comment beginning "needs").
func imageDocCommands(t *testing.T) (lines []string, external []bool) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(b), "\n## The container image\n")
	if !ok {
		t.Fatal("docs/operations.md has no section on the container image")
	}
	sec, _, _ = strings.Cut(sec, "\n## ")
	for _, blk := range strings.Split(sec, "```sh\n")[1:] {
		blk, _, _ = strings.Cut(blk, "```")
		for line := range strings.Lines(blk) {
			cmd, comment, _ := strings.Cut(line, "  #")
			if cmd = strings.TrimSpace(cmd); cmd == "" {
				continue
			}
			lines = append(lines, cmd)
			external = append(external, strings.HasPrefix(strings.TrimSpace(comment), "needs "))
		}
	}
	return lines, external
}

// TestImageDocCommandsAreRunOrMarked checks that each command of the image's section is
// either a `make image` that TestImage runs or marked as needing a system the tests lack.
func TestImageDocCommandsAreRunOrMarked(t *testing.T) {
	lines, external := imageDocCommands(t)
	makes := 0
	for i, l := range lines {
		switch {
		case strings.HasPrefix(l, "make image"):
			makes++
		case !external[i]:
			t.Errorf("docs/operations.md: %q is neither `make image` (run by TestImage) nor marked `# needs ...`", l)
		}
	}
	if makes < 2 {
		t.Errorf("docs/operations.md has %d make image commands, want the default one and one with VERSION and IMAGE", makes)
	}
}

// TestChartDefaultIsMakeImage checks that the Helm chart's default image is the one
// `make image` names: repository streamlimit, tag the chart's appVersion.
func TestChartDefaultIsMakeImage(t *testing.T) {
	mk, err := os.ReadFile(filepath.Join(repoRoot, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^IMAGE \?= (\S+)$`).FindSubmatch(mk)
	if m == nil {
		t.Fatal("the Makefile sets no IMAGE ?= default")
	}
	var values struct {
		Image struct{ Repository, Tag string }
	}
	var chart struct {
		AppVersion string `yaml:"appVersion"`
	}
	for f, v := range map[string]any{"values.yaml": &values, "Chart.yaml": &chart} {
		b, err := os.ReadFile(filepath.Join(repoRoot, "deploy", "helm", "streamlimit", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(b, v); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
	}
	tag := values.Image.Tag
	if tag == "" {
		tag = chart.AppVersion
	}
	if got := values.Image.Repository + ":" + tag; got != string(m[1]) {
		t.Errorf("the chart's default image is %s, make image builds %s", got, m[1])
	}
}

// TestAssembleReproducible builds the image twice from the same made-up binary: the same
// inputs give the same digest, another epoch another one, and every file has the epoch's time.
func TestAssembleReproducible(t *testing.T) {
	exe := []byte("\x7fELF not really")
	epoch := time.Unix(1_700_000_000, 0).UTC()
	digest := func(e time.Time) v1.Hash {
		img, err := Assemble("amd64", "v0", e, exe, []byte("certs"))
		if err != nil {
			t.Fatal(err)
		}
		d, err := img.Digest()
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	if a, b := digest(epoch), digest(epoch); a != b {
		t.Errorf("same inputs, digests %s and %s", a, b)
	}
	if a, b := digest(epoch), digest(epoch.Add(time.Second)); a == b {
		t.Errorf("another epoch, same digest %s: the times are not in the image", a)
	}
	img, err := Assemble("amd64", "v0", epoch, exe, nil)
	if err != nil {
		t.Fatal(err)
	}
	files := extract(t, img, epoch)
	if _, ok := files["etc/ssl/certs/ca-certificates.crt"]; ok {
		t.Error("a CA bundle without one asked for")
	}
	if got := files["streamlimit"]; !bytes.Equal(got, exe) {
		t.Errorf("/streamlimit holds %q, want the binary", got)
	}
	for _, s := range []string{"", "0", "1700000000"} {
		if _, err := SourceDateEpoch(s); err != nil {
			t.Errorf("SourceDateEpoch(%q): %v", s, err)
		}
	}
	if _, err := SourceDateEpoch("yesterday"); err == nil {
		t.Error("SourceDateEpoch(yesterday): no error")
	}
}

// extract returns the regular files of the image's file system by path, failing the test
// on a file whose time is not epoch or whose owner is neither root nor NonRoot.
func extract(t *testing.T, img v1.Image, epoch time.Time) map[string][]byte {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	files := map[string][]byte{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if !h.ModTime.Equal(epoch) {
			t.Errorf("%s: time %v, want SOURCE_DATE_EPOCH %v", h.Name, h.ModTime, epoch)
		}
		if (h.Uid != 0 && h.Uid != NonRoot) || h.Gid != h.Uid {
			t.Errorf("%s: owner %d:%d", h.Name, h.Uid, h.Gid)
		}
		if h.Typeflag != tar.TypeReg {
			if h.Typeflag != tar.TypeDir {
				t.Errorf("%s: type %c: only files and directories belong in the image", h.Name, h.Typeflag)
			}
			continue
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[strings.TrimPrefix(h.Name, "/")] = b
	}
	return files
}

// TestImage runs the `make image` commands of docs/operations.md, the first one twice, and
// checks what they build: the same digest twice, a config that runs the binary as a
// non-root user, no shell, a static binary that runs, a tarball docker load and ctr read,
// and one that a registry takes and gives back by the same digest.
func TestImage(t *testing.T) {
	testenv.RealParts(t)
	const epoch = 1_700_000_000
	lines, _ := imageDocCommands(t)
	dir := t.TempDir()
	build := func(line, out string) (v1.Image, time.Duration) {
		t.Helper()
		args := append(strings.Fields(line)[1:], "-s", "-C", repoRoot,
			"IMAGE_TAR="+out, "SOURCE_DATE_EPOCH="+strconv.Itoa(epoch))
		cmd := exec.Command("make", args...)
		// A make above this test (make test) must not hand its job server down.
		cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool {
			return strings.HasPrefix(kv, "MAKEFLAGS=") || strings.HasPrefix(kv, "MFLAGS=") || strings.HasPrefix(kv, "MAKELEVEL=")
		})
		start := time.Now()
		b, err := cmd.CombinedOutput()
		took := time.Since(start)
		if err != nil {
			t.Fatalf("%s: %v\n%s", line, err, b)
		}
		t.Logf("%s (%v): %s", line, took.Round(time.Millisecond), bytes.TrimSpace(b))
		img, err := tarball.ImageFromPath(out, nil)
		if err != nil {
			t.Fatal(err)
		}
		return img, took
	}
	var makes []string
	for _, l := range lines {
		if strings.HasPrefix(l, "make image") {
			makes = append(makes, l)
		}
	}
	if len(makes) < 2 {
		t.Fatalf("docs/operations.md has make image commands %q, want two", makes)
	}
	first := filepath.Join(dir, "first.tar")
	img, _ := build(makes[0], first)
	again, took := build(makes[0], filepath.Join(dir, "again.tar"))
	d1, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	if d2, err := again.Digest(); err != nil || d1 != d2 {
		t.Errorf("two builds of the same source: digests %s and %s (%v)", d1, d2, err)
	}
	if a, b := fileSum(t, first), fileSum(t, filepath.Join(dir, "again.tar")); a != b {
		t.Errorf("two builds of the same source: tarballs differ (sha256 %x, %x)", a, b)
	}
	st, err := os.Stat(first)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("FIGURE image: %s, tarball %d bytes, rebuild with a warm cache %v", d1, st.Size(), took.Round(time.Millisecond))

	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cfg.Config.Entrypoint, []string{Entrypoint}) || len(cfg.Config.Cmd) != 0 {
		t.Errorf("entrypoint %q, command %q; want [%s] and none", cfg.Config.Entrypoint, cfg.Config.Cmd, Entrypoint)
	}
	uid, _, _ := strings.Cut(cfg.Config.User, ":")
	if n, err := strconv.Atoi(uid); err != nil || n == 0 {
		t.Errorf("user %q: want a numeric non-root uid", cfg.Config.User)
	}
	if want := time.Unix(epoch, 0).UTC(); !cfg.Created.Equal(want) {
		t.Errorf("created %v, want SOURCE_DATE_EPOCH %v", cfg.Created, want)
	}
	files := extract(t, img, time.Unix(epoch, 0).UTC())
	for name := range files {
		if strings.HasPrefix(name, "bin/") || strings.HasPrefix(name, "usr/") || strings.HasSuffix(name, "/sh") {
			t.Errorf("the image has %s: it should hold no shell nor tools", name)
		}
	}
	if !strings.Contains(string(files["etc/passwd"]), fmt.Sprintf(":%d:%d:", NonRoot, NonRoot)) {
		t.Errorf("/etc/passwd names no user %d:\n%s", NonRoot, files["etc/passwd"])
	}
	if len(files["etc/ssl/certs/ca-certificates.crt"]) == 0 {
		t.Error("no CA bundle: --kafka-tls and --redis-tls would trust nothing without a CA file")
	}

	exe := filepath.Join(dir, "streamlimit")
	if err := os.WriteFile(exe, files["streamlimit"], 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := elf.Open(exe)
	if err != nil {
		t.Fatalf("/streamlimit is not an ELF binary: %v", err)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("/streamlimit has an ELF interpreter: it is not static")
		}
	}
	if libs, err := f.ImportedLibraries(); err != nil || len(libs) != 0 {
		t.Errorf("/streamlimit needs shared libraries %q (%v)", libs, err)
	}
	f.Close()
	out, err := exec.Command(exe, "--version").CombinedOutput()
	want := "streamlimit " + cfg.Config.Labels["org.opencontainers.image.version"] + "\n"
	if err != nil || string(out) != want {
		t.Errorf("/streamlimit --version: %q (%v), want %q", out, err, want)
	}
	if out, err := exec.Command(exe, "rules", "check", filepath.Join(repoRoot, "deploy", "rules")).CombinedOutput(); err != nil {
		t.Errorf("/streamlimit rules check deploy/rules: %v\n%s", err, out)
	}

	// docker load and ctr images import read manifest.json: the config, the layers, the tag.
	manifest := readFromTar(t, first, "manifest.json")
	var m []struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	if err := json.Unmarshal(manifest, &m); err != nil || len(m) != 1 || len(m[0].Layers) != 2 || len(m[0].RepoTags) != 1 {
		t.Fatalf("manifest.json: %s (%v), want one image with two layers and one tag", manifest, err)
	}

	// The second command stamps another version and names another image.
	second := filepath.Join(dir, "second.tar")
	other, _ := build(makes[1], second)
	version := regexp.MustCompile(`VERSION=(\S+)`).FindStringSubmatch(makes[1])
	imageName := regexp.MustCompile(`IMAGE=(\S+)`).FindStringSubmatch(makes[1])
	ocfg, err := other.ConfigFile()
	if err != nil || version == nil || imageName == nil {
		t.Fatalf("%s: %v", makes[1], err)
	}
	if got := ocfg.Config.Labels["org.opencontainers.image.version"]; got != version[1] {
		t.Errorf("%s: version %q", makes[1], got)
	}
	if got := string(readFromTar(t, second, "manifest.json")); !strings.Contains(got, `"`+imageName[1]+`"`) {
		t.Errorf("%s: manifest.json %s does not name %s", makes[1], got, imageName[1])
	}

	// What crane push does, to a registry in this process, and back.
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	ref := strings.TrimPrefix(srv.URL, "http://") + "/streamlimit:dev"
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := crane.Push(img, ref, crane.WithContext(ctx)); err != nil {
		t.Fatalf("push: %v", err)
	}
	got, err := crane.Digest(ref, crane.WithContext(ctx))
	if err != nil || got != d1.String() {
		t.Errorf("the registry has %s (%v), we pushed %s", got, err, d1)
	}
}

func fileSum(t *testing.T, path string) [32]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b)
}

func readFromTar(t *testing.T, path, name string) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err != nil {
			t.Fatalf("%s: no %s (%v)", path, name, err)
		}
		if h.Name == name {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			return b
		}
	}
}
