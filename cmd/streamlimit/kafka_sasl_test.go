package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamlimit/streamlimit/internal/testenv"
)

// TestKafkaSASLSSL starts a private broker with a SASL_SSL listener (a CA made here, PEM
// key and trust stores, SCRAM-SHA-512 and PLAIN users) and runs `topics ensure`, an
// aggregator (PLAIN), an enforcer (SCRAM-SHA-512) and `counts get` through it: the
// enforcer's admitted hits come back as counts. A wrong password and plaintext are refused.
func TestKafkaSASLSSL(t *testing.T) {
	testenv.RealParts(t)
	dir := t.TempDir()
	caFile, storeFile := writeBrokerPKI(t, dir)
	props := filepath.Join(dir, "sasl.properties")
	if err := os.WriteFile(props, []byte(fmt.Sprintf(`listeners=PLAINTEXT://127.0.0.1:@PORT@,SASL_SSL://127.0.0.1:@XPORT@,CONTROLLER://127.0.0.1:@CPORT@
advertised.listeners=PLAINTEXT://127.0.0.1:@PORT@,SASL_SSL://127.0.0.1:@XPORT@
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_SSL:SASL_SSL
sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-512
listener.name.sasl_ssl.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required user_bob="bob-secret";
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
ssl.keystore.type=PEM
ssl.keystore.location=%[1]s
ssl.truststore.type=PEM
ssl.truststore.location=%[2]s
`, storeFile, caFile)), 0o600); err != nil {
		t.Fatal(err)
	}
	b := testenv.PrivateKafkaEnv(t, "STREAMLIMIT_KAFKA_EXTRA_PROPERTIES="+props)
	saslAddr := b.ExtraAddr()

	// The SCRAM user is made through the broker's plaintext listener, as an operator would
	// through an admin listener.
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := kadm.NewClient(cl).AlterUserSCRAMs(ctx, nil, []kadm.UpsertSCRAM{{User: "alice", Mechanism: kadm.ScramSha512, Iterations: 4096, Password: "alice-secret"}})
	cl.Close()
	if err == nil {
		err = res.Error()
	}
	if err != nil {
		t.Fatalf("creating the SCRAM user: %v", err)
	}

	sec := func(mech, user, pass string) []string {
		return []string{"--brokers", saslAddr, "--kafka-tls-ca", caFile, "--kafka-sasl-mechanism", mech, "--kafka-sasl-user", user, "--kafka-sasl-password", pass}
	}
	scram := sec("SCRAM-SHA-512", "alice", "alice-secret")
	plain := sec("PLAIN", "bob", "bob-secret")
	topicArgs := []string{"--hits-topic", "hits", "--counts-topic", "counts", "--partitions", "2", "--counts-partitions", "2"}

	// The SCRAM credential reaches the broker's cache shortly after it is altered.
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, err := run(t, append(append([]string{"topics", "ensure"}, scram...), topicArgs...)...)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("topics ensure over SASL_SSL (SCRAM-SHA-512): %v\n%s\nbroker log: %s", err, out, b.LogFile())
		}
		time.Sleep(500 * time.Millisecond)
	}
	if _, err := run(t, append(append([]string{"topics", "describe"}, sec("SCRAM-SHA-512", "alice", "wrong")...), topicArgs...)...); err == nil {
		t.Error("a wrong SCRAM password was accepted")
	}
	if _, err := run(t, append([]string{"topics", "describe", "--brokers", saslAddr}, topicArgs...)...); err == nil {
		t.Error("plaintext was accepted on the SASL_SSL listener")
	}

	rules := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(rules, []byte("domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 100}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The commands log at info level (to the process's stderr, which go test shows when
	// the package fails): what each did is then on record.
	serve(t, append([]string{"aggregator", "--hits-topic", "hits", "--counts-topic", "counts", "--admin-listen", anyPort, "--log-level", "info"}, plain...)...)
	// A Redis key prefix of its own: with the suite's Redis (STREAMLIMIT_REDIS_ADDR, which
	// the command reads) the README's user 42 is counted by other tests too.
	prefix := fmt.Sprintf("kafka-sasl-%d:", time.Now().UnixNano())
	httpAddr := serve(t, append([]string{"enforcer", "--site", "eu", "--rules", rules, "--hits-topic", "hits", "--counts-topic", "counts",
		"--http-listen", anyPort, "--grpc-listen", "off", "--log-level", "info", "--redis-key-prefix", prefix}, scram...)...).addr(t, "http")

	admitted, answerBy := 0, time.Now().Add(30*time.Second)
	for admitted < 3 {
		resp, err := http.Post("http://"+httpAddr+"/v1/check", "application/json",
			strings.NewReader(`{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"42"}]}]}`))
		if err != nil {
			if time.Now().After(answerBy) {
				t.Fatalf("enforcer never answered: %v", err)
			}
			time.Sleep(100 * time.Millisecond)
			continue
		}
		resp.Body.Close()
		if resp.StatusCode == 200 {
			admitted++
		} else if time.Now().After(answerBy) {
			t.Fatalf("user 42 (100 a minute) still denied (%d) after 30 s with %d admitted", resp.StatusCode, admitted)
		}
	}
	deadline = time.Now().Add(45 * time.Second)
	for {
		out, err := run(t, append([]string{"counts", "get", "api|user=42#60s", "--counts-topic", "counts"}, scram...)...)
		if err == nil && strings.Contains(out, "eu") && strings.Contains(out, "3") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("counts get over SASL_SSL never showed eu's 3 hits: %v\n%s", err, out)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// writeBrokerPKI makes a CA and a broker certificate for 127.0.0.1, and writes the CA
// (the clients' and the broker's trust store) and the broker's PEM key store: its PKCS #8
// key followed by its certificate.
func writeBrokerPKI(t *testing.T, dir string) (caFile, storeFile string) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "streamlimit test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, KeyUsage: x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	pk, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	caFile, storeFile = filepath.Join(dir, "ca.pem"), filepath.Join(dir, "broker.pem")
	store := append(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pk}), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})...)
	for f, b := range map[string][]byte{caFile: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), storeFile: store} {
		if err := os.WriteFile(f, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return caFile, storeFile
}
