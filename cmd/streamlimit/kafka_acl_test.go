package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/streamlimit/streamlimit/internal/testenv"
	"github.com/streamlimit/streamlimit/topics"
)

// aclRecipe returns the kafka-acls.sh command lines of docs/hardening.md's recipe ("Who
// may write counts"), each split into its arguments, with $ADMIN replaced by admin.
func aclRecipe(t *testing.T, admin string) [][]string {
	t.Helper()
	f, err := os.Open(filepath.Join("..", "..", "docs", "hardening.md"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var cmds [][]string
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "### Who may write counts"):
			in = true
		case in && strings.HasPrefix(line, "#"):
			in = false
		case in && strings.HasPrefix(line, "kafka-acls.sh "):
			args := strings.Fields(strings.ReplaceAll(line, `"$ADMIN"`, admin))
			cmds = append(cmds, args[1:])
		}
	}
	if len(cmds) == 0 {
		t.Fatal("docs/hardening.md has no kafka-acls.sh lines under \"### Who may write counts\"")
	}
	return cmds
}

// aclBroker is a private broker with ACLs on (KRaft's StandardAuthorizer, nothing allowed
// without an ACL) and a SASL listener with three SCRAM users, aggregator, enforcer and
// mallory (each's password its name and "-secret"), on which an admin made the topics hits
// and counts (2 partitions each) and applied the ACL recipe of docs/hardening.md with
// kafka-acls.sh.
type aclBroker struct {
	*testenv.Broker
	// sasl is the SASL listener's address, the clients'.
	sasl string
}

// startACLBroker starts an aclBroker, stopped when the test ends.
func startACLBroker(t *testing.T) aclBroker {
	t.Helper()
	props := filepath.Join(t.TempDir(), "acl.properties")
	// The PLAINTEXT listener is the admin's (and the controller's) and a super user, as an
	// operator's admin listener would be; clients use the SASL listener.
	if err := os.WriteFile(props, []byte(`listeners=PLAINTEXT://127.0.0.1:@PORT@,SASL_PLAINTEXT://127.0.0.1:@XPORT@,CONTROLLER://127.0.0.1:@CPORT@
advertised.listeners=PLAINTEXT://127.0.0.1:@PORT@,SASL_PLAINTEXT://127.0.0.1:@XPORT@
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT
sasl.enabled.mechanisms=SCRAM-SHA-512
listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
super.users=User:ANONYMOUS
allow.everyone.if.no.acl.found=false
`), 0o600); err != nil {
		t.Fatal(err)
	}
	b := aclBroker{Broker: testenv.PrivateKafkaEnv(t, "STREAMLIMIT_KAFKA_EXTRA_PROPERTIES="+props)}
	b.sasl = b.ExtraAddr()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin, err := kgo.NewClient(kgo.SeedBrokers(b.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	var users []kadm.UpsertSCRAM
	for _, u := range []string{"aggregator", "enforcer", "mallory"} {
		users = append(users, kadm.UpsertSCRAM{User: u, Mechanism: kadm.ScramSha512, Iterations: 4096, Password: u + "-secret"})
	}
	res, err := kadm.NewClient(admin).AlterUserSCRAMs(ctx, nil, users)
	if err == nil {
		err = res.Error()
	}
	if err != nil {
		t.Fatalf("creating the SCRAM users: %v", err)
	}
	topicArgs := []string{"--hits-topic", "hits", "--counts-topic", "counts", "--partitions", "2", "--counts-partitions", "2"}
	if out, err := run(t, append([]string{"topics", "ensure", "--brokers", b.Addr()}, topicArgs...)...); err != nil {
		t.Fatalf("topics ensure (admin): %v\n%s", err, out)
	}
	for _, args := range aclRecipe(t, b.Addr()) {
		if out, err := b.ACLs(args...); err != nil {
			t.Fatalf("kafka-acls.sh %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	return b
}

// sec returns the flags that log a command in on the SASL listener as user.
func (b aclBroker) sec(user string) []string {
	return []string{"--brokers", b.sasl, "--kafka-sasl-mechanism", "SCRAM-SHA-512", "--kafka-sasl-user", user, "--kafka-sasl-password", user + "-secret"}
}

// client returns a client logged in on the SASL listener as user, with opts, closed when
// the test ends.
func (b aclBroker) client(t *testing.T, user string, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(b.sasl), kgo.SASL(scram.Auth{User: user, Pass: user + "-secret"}.AsSha512Mechanism())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// TestKafkaACLRecipe starts an aclBroker (the recipe applied) and checks the recipe: the
// aggregator and the enforcer, each with its own user, count hits end to end; the
// enforcer's user, and a user without ACLs, cannot write a count (a forged count, total 0,
// is refused by the broker), nor can the user without ACLs read one.
func TestKafkaACLRecipe(t *testing.T) {
	testenv.RealParts(t)
	b := startACLBroker(t)
	sec := b.sec
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	rules := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(rules, []byte("domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 100}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The enforcer also believes only its aggregator's records (--aggregator-instances).
	// Both log at info level (to the process's stderr, which go test shows when the
	// package fails), so that a failure has what each did on record.
	aggAdmin := serve(t, append([]string{"aggregator", "--hits-topic", "hits", "--counts-topic", "counts", "--admin-listen", anyPort, "--log-level", "info",
		"--instance-id", "agg-eu-1"}, sec("aggregator")...)...).addr(t, "admin")
	// A Redis key prefix of its own: with the suite's Redis (STREAMLIMIT_REDIS_ADDR, which
	// the command reads) the README's user 42 is counted by other tests too.
	prefix := fmt.Sprintf("kafka-acl-%d:", time.Now().UnixNano())
	httpAddr := serve(t, append([]string{"enforcer", "--site", "eu", "--rules", rules, "--hits-topic", "hits", "--counts-topic", "counts",
		"--http-listen", anyPort, "--grpc-listen", "off", "--log-level", "info", "--aggregator-instances", "agg-eu-1",
		"--redis-key-prefix", prefix}, sec("enforcer")...)...).addr(t, "http")
	admitted, answerBy := 0, time.Now().Add(60*time.Second)
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
			t.Fatalf("user 42 (100 a minute) still denied (%d) after 60 s with %d admitted", resp.StatusCode, admitted)
		}
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		out, err := run(t, append([]string{"counts", "get", "api|user=42#60s", "--counts-topic", "counts"}, sec("enforcer")...)...)
		if err == nil && strings.Contains(out, "eu") && strings.Contains(out, "3") {
			break
		}
		if time.Now().After(deadline) {
			// What each side did, for the record: the enforcer's producer, the aggregator's
			// consumption and publishing.
			t.Fatalf("the aggregator's count of eu's 3 hits never showed: %v\n%s\nenforcer: %s\naggregator: %s\nbroker log: %s", err, out,
				nonZero(t, "http://"+httpAddr+"/metrics", "streamlimit_producer_"), nonZero(t, "http://"+aggAdmin+"/metrics", "streamlimit_aggregator_"), b.LogFile())
		}
		time.Sleep(500 * time.Millisecond)
	}

	// The enforcer's snapshot took the aggregator's count and heartbeats (fresh), and
	// refused no record as another writer's.
	deadline = time.Now().Add(30 * time.Second)
	for {
		m := scrape(t, "http://"+httpAddr+"/metrics")
		if m["streamlimit_snapshot_keys"] >= 1 && m["streamlimit_snapshot_stale"] == 0 {
			if n := m[`streamlimit_snapshot_bad_records_total{reason="unknown_instance"}`]; n != 0 {
				t.Fatalf("the enforcer refused %v of its aggregator's records", n)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the enforcer's snapshot never took the aggregator's records: %v", m)
		}
		time.Sleep(500 * time.Millisecond)
	}

	// A forged count: total 0 for the key the enforcer just counted.
	c := topics.Count{Key: "api|user=42#60s", Window: 60_000, AsOf: time.Now().UnixMilli(), Total: 0}
	forged, err := c.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	client := func(user string) *kgo.Client {
		return b.client(t, user, kgo.RecordRetries(2), kgo.ConsumeTopics("counts"), kgo.FetchMaxWait(time.Second))
	}
	for _, user := range []string{"enforcer", "mallory"} {
		err := client(user).ProduceSync(ctx, &kgo.Record{Topic: "counts", Key: []byte(c.Key), Value: forged}).FirstErr()
		if !errors.Is(err, kerr.TopicAuthorizationFailed) {
			t.Errorf("%s writing a count: %v, want TOPIC_AUTHORIZATION_FAILED", user, err)
		}
	}
	pctx, pcancel := context.WithTimeout(ctx, 10*time.Second)
	defer pcancel()
	var readErr error
	client("mallory").PollFetches(pctx).EachError(func(_ string, _ int32, err error) { readErr = err })
	if !errors.Is(readErr, kerr.TopicAuthorizationFailed) {
		t.Errorf("mallory reading counts: %v, want TOPIC_AUTHORIZATION_FAILED", readErr)
	}
}

// scrape reads the Prometheus text at u into a map from each sample's name with its
// labels, as written, to its value.
func scrape(t *testing.T, u string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	return parseMetrics(resp.Body)
}

// parseMetrics reads Prometheus text into a map from each sample's name with its labels,
// as written, to its value.
func parseMetrics(r io.Reader) map[string]float64 {
	m := map[string]float64{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		var v float64
		if _, err := fmt.Sscan(line[i+1:], &v); err == nil {
			m[line[:i]] = v
		}
	}
	return m
}

// nonZero returns the metrics at u whose names start with prefix and whose values are not
// zero, histogram buckets left out, one per line, or why they could not be read.
func nonZero(t *testing.T, u, prefix string) string {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	var lines []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, prefix) && !strings.HasSuffix(line, " 0") && !strings.Contains(line, "_bucket{") {
			lines = append(lines, line)
		}
	}
	return strings.Join(lines, "\n")
}
