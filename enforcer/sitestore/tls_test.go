package sitestore

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/streamlimit/streamlimit/enforcer/algo"
	"github.com/streamlimit/streamlimit/internal/testenv"
)

// TestACLUserOverTLS: a Store built from Addrs, Username, Password and TLS decides in a
// redis-server that accepts only TLS and an ACL user; the same user with rights on other
// keys only is refused (NOPERM) and decided in process.
func TestACLUserOverTLS(t *testing.T) {
	dir := t.TempDir()
	roots := writeCerts(t, dir)
	tlsCfg := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	srv := testenv.StartRedisServer(t, testenv.RedisServerOptions{
		Args: func(port int, _ string) []string {
			return []string{"--port", "0", "--tls-port", strconv.Itoa(port),
				"--tls-cert-file", filepath.Join(dir, "cert.pem"), "--tls-key-file", filepath.Join(dir, "key.pem"),
				"--tls-ca-cert-file", filepath.Join(dir, "cert.pem"), "--tls-auth-clients", "no",
				"--user", "default", "off",
				"--user", "limiter", "on", ">s3cret", "~sl:*", "+@all",
				"--user", "other", "on", ">s3cret", "~elsewhere:*", "+@all"}
		},
		Ready: func(addr string) bool {
			c := redis.NewClient(&redis.Options{Addr: addr, Username: "limiter", Password: "s3cret", TLSConfig: tlsCfg, MaxRetries: -1})
			defer c.Close()
			return c.Ping(context.Background()).Err() == nil
		},
	})
	addr := srv.Addr()
	ping := redis.NewClient(&redis.Options{Addr: addr, Username: "limiter", Password: "s3cret", TLSConfig: tlsCfg})
	defer ping.Close()

	op := algo.Op{Key: "d|tls#1m", Algorithm: algo.SlidingLog, Limit: algo.Limit{Requests: 2, Window: time.Minute}, N: 1}
	out := make([]algo.Decision, 1)
	for _, user := range []string{"limiter", "other"} {
		s := newStore(t, nil, "sl:", func(c *Config) {
			c.Addrs, c.Username, c.Password, c.TLS = []string{addr}, user, "s3cret", tlsCfg
		})
		ok, fb := s.AllowAll(context.Background(), t0, []algo.Op{op}, out)
		if user == "limiter" && (!ok || fb) {
			t.Fatalf("ACL user over TLS: allowed %v fellBack %v; want a Redis decision", ok, fb)
		}
		if user == "other" && !fb {
			t.Fatal("a user without rights on the store's keys was decided in Redis")
		}
	}
	if n, err := ping.Exists(context.Background(), "sl:{d}d|tls#1m").Result(); err != nil || n != 1 {
		t.Fatalf("the decision is not in Redis: %v, %v", n, err)
	}
}

// writeCerts writes a self-signed certificate for 127.0.0.1 (cert.pem, key.pem) to dir
// and returns a pool that trusts it.
func writeCerts(t *testing.T, dir string) *x509.CertPool {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "streamlimit test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	if err := os.WriteFile(filepath.Join(dir, "cert.pem"), certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "key.pem"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(certPEM)
	return pool
}
