package server_test

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
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/streamlimit/streamlimit/serve/server"
)

// testPKI is a CA made for one test, with a server certificate for 127.0.0.1 and a
// client certificate, as PEM files.
type testPKI struct {
	dir                        string
	caPEM                      []byte
	ca                         *x509.Certificate
	caKey                      *ecdsa.PrivateKey
	serverCert, serverKey      string
	clientCert, clientKey, caF string
}

func newPKI(t *testing.T) *testPKI {
	t.Helper()
	p := &testPKI{dir: t.TempDir()}
	var err error
	p.caKey, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &p.caKey.PublicKey, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	p.ca, _ = x509.ParseCertificate(der)
	p.caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	p.caF = p.write(t, "ca.pem", p.caPEM)
	p.serverCert, p.serverKey = p.issue(t, "server", 2, x509.ExtKeyUsageServerAuth)
	p.clientCert, p.clientKey = p.issue(t, "client", 3, x509.ExtKeyUsageClientAuth)
	return p
}

func (p *testPKI) write(t *testing.T, name string, b []byte) string {
	t.Helper()
	f := filepath.Join(p.dir, name)
	if err := os.WriteFile(f, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// issue makes a certificate named cn for 127.0.0.1, signed by the CA.
func (p *testPKI) issue(t *testing.T, cn string, serial int64, usage x509.ExtKeyUsage) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, ExtKeyUsage: []x509.ExtKeyUsage{usage},
		KeyUsage: x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return p.write(t, cn+".pem", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})),
		p.write(t, cn+"-key.pem", pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}))
}

func (p *testPKI) clientTLS(t *testing.T, withCert bool) *tls.Config {
	t.Helper()
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(p.caPEM)
	c := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	if withCert {
		pair, err := tls.LoadX509KeyPair(p.clientCert, p.clientKey)
		if err != nil {
			t.Fatal(err)
		}
		c.Certificates = []tls.Certificate{pair}
	}
	return c
}

func httpsGet(c *http.Client, u, token string) (int, error) {
	req, _ := http.NewRequest("POST", u, strings.NewReader(checkBody))
	if strings.HasSuffix(u, "z") {
		req.Method = "GET"
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// The HTTP API and gRPC over mutual TLS with bearer tokens: a caller needs a client
// certificate from the CA and a token, except for the health endpoints.
func TestTLSClientCertsAndTokens(t *testing.T) {
	pki := newPKI(t)
	srv := startServer(t, server.Config{
		GRPCAddr:   "127.0.0.1:0",
		TLS:        server.TLSFiles{CertFile: pki.serverCert, KeyFile: pki.serverKey, ClientCAFile: pki.caF},
		AuthTokens: []string{"s3cret", "other"},
	})
	base := "https://" + srv.HTTPAddr()
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: pki.clientTLS(t, true)}}
	defer client.CloseIdleConnections()
	for _, c := range []struct {
		path, token string
		want        int
	}{
		{"/healthz", "", 200},
		{"/readyz", "", 200},
		{"/v1/check", "", 401},
		{"/v1/check", "wrong", 401},
		{"/v1/check", "s3cret", 200},
		{"/v1/check", "other", 200},
	} {
		if code, err := httpsGet(client, base+c.path, c.token); err != nil || code != c.want {
			t.Errorf("%s with token %q: %d %v, want %d", c.path, c.token, code, err, c.want)
		}
	}
	noCert := &http.Client{Transport: &http.Transport{TLSClientConfig: pki.clientTLS(t, false)}}
	if _, err := httpsGet(noCert, base+"/healthz", ""); err == nil {
		t.Error("a client without a certificate was served")
	}
	if code, err := httpsGet(http.DefaultClient, "http://"+srv.HTTPAddr()+"/healthz", ""); err == nil && code != http.StatusBadRequest {
		t.Errorf("plaintext HTTP on the TLS listener: %d, want an error or 400", code)
	}

	conn, err := grpc.NewClient(srv.GRPCAddr(), grpc.WithTransportCredentials(credentials.NewTLS(pki.clientTLS(t, true))))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req := &rlsv3.RateLimitRequest{Domain: "api"}
	if _, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, req); status.Code(err) != codes.Unauthenticated {
		t.Errorf("gRPC without token: %v, want Unauthenticated", err)
	}
	authed := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer s3cret")
	if _, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(authed, req); status.Code(err) == codes.Unauthenticated {
		t.Errorf("gRPC with token: %v", err)
	}
	if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("gRPC health without token: %v", err)
	}
}

// A renewed certificate is served without a restart.
func TestTLSCertificateReloaded(t *testing.T) {
	pki := newPKI(t)
	srv := startServer(t, server.Config{TLS: server.TLSFiles{CertFile: pki.serverCert, KeyFile: pki.serverKey}})
	serial := func() int64 {
		c, err := tls.Dial("tcp", srv.HTTPAddr(), pki.clientTLS(t, false))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0].SerialNumber.Int64()
	}
	if got := serial(); got != 2 {
		t.Fatalf("serial %d, want 2", got)
	}
	cert, key := pki.issue(t, "renewed", 9, x509.ExtKeyUsageServerAuth)
	for _, mv := range [][2]string{{key, pki.serverKey}, {cert, pki.serverCert}} {
		if err := os.Rename(mv[0], mv[1]); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, func() bool { return serial() == 9 })
}
