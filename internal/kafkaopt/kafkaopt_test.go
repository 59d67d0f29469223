package kafkaopt

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

func ping(t *testing.T, addrs []string, s Security) error {
	t.Helper()
	opts, err := s.Opts()
	if err != nil {
		t.Fatalf("Opts(%v): %v", s, err)
	}
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(addrs...)}, opts...)...)
	if err != nil {
		t.Fatalf("NewClient: %v", err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return cl.Ping(ctx)
}

func TestSASLMechanismsAuthenticate(t *testing.T) {
	for _, mech := range []string{MechanismPlain, MechanismScramSHA256, "scram-sha-512"} {
		t.Run(mech, func(t *testing.T) {
			c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.EnableSASL(),
				kfake.Superuser(strings.ToUpper(mech), "alice", "s3cret"))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if err := ping(t, c.ListenAddrs(), Security{SASLMechanism: mech, User: "alice", Password: "s3cret"}); err != nil {
				t.Fatalf("right password: %v", err)
			}
			if err := ping(t, c.ListenAddrs(), Security{SASLMechanism: mech, User: "alice", Password: "wrong"}); err == nil {
				t.Fatal("wrong password authenticated")
			}
		})
	}
}

func TestTLS(t *testing.T) {
	cert, pool := selfSigned(t)
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.TLS(&tls.Config{Certificates: []tls.Certificate{cert}}))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := ping(t, c.ListenAddrs(), Security{TLS: &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"}}); err != nil {
		t.Fatalf("TLS with the right CA: %v", err)
	}
	if err := ping(t, c.ListenAddrs(), Security{TLS: &tls.Config{RootCAs: x509.NewCertPool(), ServerName: "127.0.0.1"}}); err == nil {
		t.Fatal("TLS with an unknown CA connected")
	}
}

func TestOptsRejectsBadSettings(t *testing.T) {
	for _, s := range []Security{
		{SASLMechanism: "GSSAPI", User: "u", Password: "p"},
		{SASLMechanism: "PLAIN", User: "u"},
		{SASLMechanism: "SCRAM-SHA-256", Password: "p"},
		{User: "u", Password: "p"},
	} {
		if _, err := s.Opts(); !errors.Is(err, ErrBadSecurity) {
			t.Errorf("Opts(%+v) = %v, want ErrBadSecurity", s, err)
		}
	}
	opts, err := Security{}.Opts()
	if err != nil || len(opts) != 0 {
		t.Errorf("zero Security: %d opts, %v; want none", len(opts), err)
	}
	if s := (Security{SASLMechanism: "plain", User: "u", Password: "hunter2"}).String(); strings.Contains(s, "hunter2") {
		t.Errorf("String leaks the password: %q", s)
	}
}

func selfSigned(t *testing.T) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "kfake"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA:         true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, pool
}

func TestWarnings(t *testing.T) {
	plain := Security{SASLMechanism: "plain", User: "u", Password: "p"}
	if w := plain.Warnings(); len(w) != 1 || !strings.Contains(w[0], "in clear") {
		t.Fatalf("PLAIN without TLS: warnings %q", w)
	}
	plain.TLS = &tls.Config{}
	if w := plain.Warnings(); len(w) != 0 {
		t.Fatalf("PLAIN with TLS: warnings %q", w)
	}
	if w := (Security{SASLMechanism: MechanismScramSHA512, User: "u", Password: "p"}).Warnings(); len(w) != 0 {
		t.Fatalf("SCRAM without TLS: warnings %q", w)
	}
}
