// Command ociimage builds the streamlimit container image without a container engine and
// writes it as a tarball that `docker load`, `ctr images import` and `crane push` accept
// (`make image`, docs/operations.md).
//
// The image is built FROM scratch: one layer holds /etc/passwd and /etc/group with the
// non-root user 65532, /tmp, and a CA bundle taken from the host (the Kafka and Redis TLS
// clients trust the system's CAs unless --kafka-tls-ca or --redis-tls-ca names a file); a
// second holds the static binary, /streamlimit, which is the entrypoint. There is no shell.
//
// The build is reproducible: the binary is built with CGO_ENABLED=0, -trimpath and
// -buildvcs=false, every file of the layers has the time SOURCE_DATE_EPOCH (0 when unset)
// and root or 65532 as owner, the entries are in a fixed order, and the config's times are
// that same instant. The same source, Go version, CA bundle, version and epoch give the
// same image digest.
package main

import (
	"archive/tar"
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// NonRoot is the user and group the image runs as: distroless's "nonroot", which the Helm
// chart's securityContext names too.
const NonRoot = 65532

// Entrypoint is where the binary is in the image.
const Entrypoint = "/streamlimit"

// DefaultCACerts is the CA bundle of Debian-like hosts, where Go's crypto/x509 looks first.
const DefaultCACerts = "/etc/ssl/certs/ca-certificates.crt"

// Options say what to build.
type Options struct {
	// Dir is the module's root; Package the main package within it.
	Dir, Package string
	// Version is stamped into the binary with -X main.version.
	Version string
	// Arch is the GOARCH of the binary and of the image (the image's OS is linux).
	Arch string
	// Epoch is the time of every file and of the config (SOURCE_DATE_EPOCH).
	Epoch time.Time
	// CACerts is the CA bundle copied to DefaultCACerts in the image; empty for none.
	CACerts string
	// Go is the go command.
	Go string
}

func main() {
	var o Options
	var out, tag string
	flag.StringVar(&out, "o", "streamlimit-image.tar", "the tarball to write")
	flag.StringVar(&tag, "tag", "streamlimit:dev", "the image name and tag recorded in the tarball")
	flag.StringVar(&o.Dir, "C", ".", "the module's root directory")
	flag.StringVar(&o.Package, "pkg", "./cmd/streamlimit", "the main package to build")
	flag.StringVar(&o.Version, "version", "dev", "the version stamped into the binary")
	flag.StringVar(&o.Arch, "arch", runtime.GOARCH, "GOARCH of the binary and the image")
	flag.StringVar(&o.CACerts, "ca-certs", DefaultCACerts, "CA bundle to copy into the image; empty for none")
	flag.Parse()
	o.Go = os.Getenv("GO")
	if o.Go == "" {
		o.Go = "go"
	}
	epoch, err := SourceDateEpoch(os.Getenv("SOURCE_DATE_EPOCH"))
	if err == nil {
		o.Epoch = epoch
		err = run(context.Background(), o, out, tag)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "ociimage:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o Options, out, tag string) error {
	ref, err := name.NewTag(tag)
	if err != nil {
		return fmt.Errorf("-tag: %w", err)
	}
	img, err := Build(ctx, o)
	if err != nil {
		return err
	}
	if err := tarball.WriteToFile(out, ref, img); err != nil {
		return fmt.Errorf("write %s: %w", out, err)
	}
	d, err := img.Digest()
	if err != nil {
		return err
	}
	st, err := os.Stat(out)
	if err != nil {
		return err
	}
	fmt.Printf("%s %s %s (%d bytes)\n", out, ref, d, st.Size())
	return nil
}

// SourceDateEpoch parses SOURCE_DATE_EPOCH: seconds since 1970, the Unix epoch when empty.
func SourceDateEpoch(s string) (time.Time, error) {
	if s == "" {
		return time.Unix(0, 0).UTC(), nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH=%q: not a number of seconds", s)
	}
	return time.Unix(n, 0).UTC(), nil
}

// Build builds the binary and returns the image holding it.
func Build(ctx context.Context, o Options) (v1.Image, error) {
	tmp, err := os.MkdirTemp("", "ociimage")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	bin := filepath.Join(tmp, "streamlimit")
	cmd := exec.CommandContext(ctx, o.Go, "build", "-trimpath", "-buildvcs=false",
		"-ldflags", "-s -w -X main.version="+o.Version, "-o", bin, o.Package)
	cmd.Dir = o.Dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+o.Arch)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("go build %s: %w", o.Package, err)
	}
	exe, err := os.ReadFile(bin)
	if err != nil {
		return nil, err
	}
	var certs []byte
	if o.CACerts != "" {
		if certs, err = os.ReadFile(o.CACerts); err != nil {
			return nil, fmt.Errorf("CA bundle: %w", err)
		}
	}
	return Assemble(o.Arch, o.Version, o.Epoch, exe, certs)
}

// entry is one file or directory of a layer.
type entry struct {
	name string
	mode int64 // permission bits
	dir  bool  // a directory, else a regular file holding data
	uid  int
	data []byte
}

// Assemble makes the image from the binary and the CA bundle (none when certs is nil).
func Assemble(arch, version string, epoch time.Time, exe, certs []byte) (v1.Image, error) {
	base := []entry{
		{name: "etc/", mode: 0o755, dir: true},
		{name: "etc/group", mode: 0o644, data: fmt.Appendf(nil, "root:x:0:\nnonroot:x:%d:\n", NonRoot)},
		{name: "etc/passwd", mode: 0o644, data: fmt.Appendf(nil,
			"root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%[1]d:%[1]d:nonroot:/home/nonroot:/sbin/nologin\n", NonRoot)},
	}
	if certs != nil {
		base = append(base,
			entry{name: "etc/ssl/", mode: 0o755, dir: true},
			entry{name: "etc/ssl/certs/", mode: 0o755, dir: true},
			entry{name: DefaultCACerts[1:], mode: 0o644, data: certs})
	}
	base = append(base,
		entry{name: "home/", mode: 0o755, dir: true},
		entry{name: "home/nonroot/", mode: 0o700, dir: true, uid: NonRoot},
		entry{name: "tmp/", mode: 0o1777, dir: true})
	app := []entry{{name: Entrypoint[1:], mode: 0o755, data: exe}}

	cfg := &v1.ConfigFile{
		Architecture: arch,
		OS:           "linux",
		Created:      v1.Time{Time: epoch},
		Config: v1.Config{
			Entrypoint: []string{Entrypoint},
			User:       fmt.Sprintf("%d:%d", NonRoot, NonRoot),
			WorkingDir: "/home/nonroot",
			Labels: map[string]string{
				"org.opencontainers.image.title":   "streamlimit",
				"org.opencontainers.image.version": version,
			},
		},
	}
	img, err := mutate.ConfigFile(empty.Image, cfg)
	if err != nil {
		return nil, err
	}
	for _, l := range []struct {
		files []entry
		by    string
	}{
		{base, "ociimage: /etc/passwd, /etc/group, CA bundle, /home/nonroot, /tmp"},
		{app, "ociimage: " + Entrypoint},
	} {
		layer, err := layer(l.files, epoch)
		if err != nil {
			return nil, err
		}
		img, err = mutate.Append(img, mutate.Addendum{
			Layer:   layer,
			History: v1.History{Created: v1.Time{Time: epoch}, CreatedBy: l.by},
		})
		if err != nil {
			return nil, err
		}
	}
	return img, nil
}

// layer writes the entries, in their order, into an uncompressed tar whose every time is
// epoch; the tarball package compresses it (deterministically: gzip without a name or time).
func layer(files []entry, epoch time.Time) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		h := &tar.Header{
			Name: f.name, Mode: f.mode, Uid: f.uid, Gid: f.uid, ModTime: epoch, Format: tar.FormatUSTAR,
		}
		if f.dir {
			h.Typeflag = tar.TypeDir
		} else {
			h.Typeflag, h.Size = tar.TypeReg, int64(len(f.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	b := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(b)), nil
	})
}
