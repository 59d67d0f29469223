// Package testenv gives tests real Apache Kafka and Redis, and names that
// keep tests sharing one broker or one Redis apart. It is for tests only:
// import it from _test.go files, never from product code.
//
// Where the services come from, in order:
//
//  1. STREAMLIMIT_KAFKA_BROKERS / STREAMLIMIT_REDIS_ADDR, which `make test`
//     (e2e/services/with-services.sh) sets after starting both on loopback.
//  2. Docker, when reachable: testcontainers-go starts one container per
//     service per test binary.
//  3. Otherwise the test is skipped, or fails when CI=true, so that CI can
//     never pass by skipping the tests that need the real services.
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/testcontainers/testcontainers-go"
	tcredis "github.com/testcontainers/testcontainers-go/modules/redis"
	"github.com/testcontainers/testcontainers-go/wait"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Environment variables read by this package.
const (
	// EnvKafkaBrokers holds the Kafka bootstrap address(es), comma-separated
	// host:port, e.g. "127.0.0.1:40123".
	EnvKafkaBrokers = "STREAMLIMIT_KAFKA_BROKERS"
	// EnvRedisAddr holds the Redis address as host:port.
	EnvRedisAddr = "STREAMLIMIT_REDIS_ADDR"
	// EnvServicesDir is the run root of the services that `make test`
	// started (the scripts' STREAMLIMIT_RUN_DIR).
	EnvServicesDir = "STREAMLIMIT_SERVICES_DIR"
	// EnvKafkaImage overrides the Kafka image used with Docker. The default
	// is DefaultKafkaImage.
	EnvKafkaImage = "STREAMLIMIT_KAFKA_IMAGE"
	// EnvRedisImage overrides the Redis image used with Docker. The default
	// is DefaultRedisImage.
	EnvRedisImage = "STREAMLIMIT_REDIS_IMAGE"
)

// Container images used when the services come from Docker.
const (
	DefaultKafkaImage = "apache/kafka:3.9.1"
	DefaultRedisImage = "redis:7"
)

// containers caches the Docker-started services for the life of the test
// binary. It is the one package-level mutable value in streamlimit, and an
// intended exception: starting a broker costs seconds, every test in a
// binary may ask for one, and tests cannot share a value any other way.
// The containers are not stopped by t.Cleanup (later tests still use them);
// testcontainers' reaper (Ryuk) removes them when the test binary exits.
type containers struct {
	dockerOnce sync.Once
	dockerErr  error

	kafkaOnce sync.Once
	kafkaAddr string
	kafkaErr  error

	redisOnce sync.Once
	redisAddr string
	redisErr  error
}

var shared containers

// Kafka returns the bootstrap address(es) of a real Kafka broker, as
// comma-separated host:port. See the package comment for where the broker
// comes from. When there is none it calls t.Skip, or t.Fatal under CI=true. Under -short
// it skips (RealParts), as do Brokers, KafkaClient, AdminClient and CreateTopic, which
// call it.
func Kafka(t testing.TB) string {
	t.Helper()
	RealParts(t)
	if v := strings.TrimSpace(os.Getenv(EnvKafkaBrokers)); v != "" {
		return v
	}
	if err := shared.docker(); err != nil {
		missing(t, EnvKafkaBrokers, "Kafka", err)
		return ""
	}
	shared.kafkaOnce.Do(func() {
		shared.kafkaAddr, shared.kafkaErr = startKafka()
	})
	if shared.kafkaErr != nil {
		t.Fatalf("testenv: starting Kafka with Docker: %v", shared.kafkaErr)
	}
	return shared.kafkaAddr
}

// Redis returns the host:port address of a real Redis server. See the
// package comment for where it comes from. When there is none it calls
// t.Skip, or t.Fatal under CI=true. Under -short it skips (RealParts), as does
// RedisClient, which calls it.
func Redis(t testing.TB) string {
	t.Helper()
	RealParts(t)
	if v := strings.TrimSpace(os.Getenv(EnvRedisAddr)); v != "" {
		return v
	}
	if err := shared.docker(); err != nil {
		missing(t, EnvRedisAddr, "Redis", err)
		return ""
	}
	shared.redisOnce.Do(func() {
		shared.redisAddr, shared.redisErr = startRedis()
	})
	if shared.redisErr != nil {
		t.Fatalf("testenv: starting Redis with Docker: %v", shared.redisErr)
	}
	return shared.redisAddr
}

// missing ends a test that needs a service nobody provided.
func missing(t testing.TB, env, what string, dockerErr error) {
	t.Helper()
	Unavailable(t, "testenv: needs real %s: %s is not set and Docker is unusable (%v); "+
		"run `make test`, which starts real Kafka and Redis and sets %s and %s", what, env, dockerErr, EnvKafkaBrokers, EnvRedisAddr)
}

// docker reports whether a Docker daemon answers, checking once per binary.
func (c *containers) docker() error {
	c.dockerOnce.Do(func() { c.dockerErr = dockerHealthy() })
	return c.dockerErr
}

func dockerHealthy() (err error) {
	if os.Getenv("DOCKER_HOST") == "" && !exists("/var/run/docker.sock") &&
		!exists(os.ExpandEnv("$HOME/.docker/run/docker.sock")) &&
		!exists(os.ExpandEnv("$XDG_RUNTIME_DIR/docker.sock")) {
		// Checked first so that machines without Docker skip in
		// microseconds instead of waiting on testcontainers' probing.
		return errors.New("no DOCKER_HOST and no docker.sock")
	}
	// testcontainers panics on some broken setups; a panic is just "no".
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("docker provider panicked: %v", r)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	p, err := testcontainers.ProviderDocker.GetProvider()
	if err != nil {
		return fmt.Errorf("docker provider: %w", err)
	}
	defer p.Close()
	if err := p.Health(ctx); err != nil {
		return fmt.Errorf("docker health: %w", err)
	}
	return nil
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// startKafka runs the apache/kafka image as a single KRaft node with the
// generic testcontainers API. (The testcontainers Kafka module at the
// version in go.mod, v0.40, does not compile against core v0.45 and only
// drives Confluent images.) The advertised listener must name the host port
// Docker maps, known only after the container starts, so the container waits
// for a file holding it before it launches Kafka.
func startKafka() (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const (
		port    = "9092/tcp"
		advFile = "/tmp/streamlimit-advertised"
	)
	c, err := testcontainers.Run(ctx, envOr(EnvKafkaImage, DefaultKafkaImage),
		testcontainers.WithExposedPorts(port),
		testcontainers.WithEnv(map[string]string{
			"KAFKA_NODE_ID":                                  "1",
			"KAFKA_PROCESS_ROLES":                            "broker,controller",
			"KAFKA_LISTENERS":                                "PLAINTEXT://0.0.0.0:9092,BROKER://0.0.0.0:9093,CONTROLLER://0.0.0.0:9094",
			"KAFKA_LISTENER_SECURITY_PROTOCOL_MAP":           "PLAINTEXT:PLAINTEXT,BROKER:PLAINTEXT,CONTROLLER:PLAINTEXT",
			"KAFKA_INTER_BROKER_LISTENER_NAME":               "BROKER",
			"KAFKA_CONTROLLER_LISTENER_NAMES":                "CONTROLLER",
			"KAFKA_CONTROLLER_QUORUM_VOTERS":                 "1@localhost:9094",
			"KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR":         "1",
			"KAFKA_OFFSETS_TOPIC_NUM_PARTITIONS":             "4",
			"KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "1",
			"KAFKA_TRANSACTION_STATE_LOG_MIN_ISR":            "1",
			"KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS":         "0",
			"KAFKA_AUTO_CREATE_TOPICS_ENABLE":                "false",
			"KAFKA_LOG_CLEANER_BACKOFF_MS":                   "500",
			"KAFKA_NUM_PARTITIONS":                           "1",
		}),
		testcontainers.WithEntrypoint("sh"),
		testcontainers.WithCmd("-c", "while [ ! -f "+advFile+" ]; do sleep 0.1; done; "+
			"export KAFKA_ADVERTISED_LISTENERS=\"$(cat "+advFile+")\"; exec /etc/kafka/docker/run"),
		testcontainers.WithLifecycleHooks(testcontainers.ContainerLifecycleHooks{
			PostStarts: []testcontainers.ContainerHook{
				func(ctx context.Context, c testcontainers.Container) error {
					if err := wait.ForMappedPort(port).WaitUntilReady(ctx, c); err != nil {
						return fmt.Errorf("wait for mapped port: %w", err)
					}
					addr, err := c.PortEndpoint(ctx, port, "")
					if err != nil {
						return fmt.Errorf("kafka endpoint: %w", err)
					}
					adv := "PLAINTEXT://" + addr + ",BROKER://localhost:9093"
					if err := c.CopyToContainer(ctx, []byte(adv), advFile, 0o644); err != nil {
						return fmt.Errorf("copy advertised listeners: %w", err)
					}
					return wait.ForLog("Kafka Server started").WaitUntilReady(ctx, c)
				},
			},
		}))
	if err != nil {
		return "", fmt.Errorf("run kafka container: %w", err)
	}
	addr, err := c.PortEndpoint(ctx, port, "")
	if err != nil {
		return "", fmt.Errorf("kafka endpoint: %w", err)
	}
	return addr, nil
}

func startRedis() (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := tcredis.Run(ctx, envOr(EnvRedisImage, DefaultRedisImage))
	if err != nil {
		return "", err
	}
	uri, err := c.ConnectionString(ctx)
	if err != nil {
		return "", fmt.Errorf("redis address: %w", err)
	}
	return strings.TrimPrefix(uri, "redis://"), nil
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// Brokers returns Kafka(t) split into a slice, ready for kgo.SeedBrokers.
func Brokers(t testing.TB) []string {
	t.Helper()
	var out []string
	for _, b := range strings.Split(Kafka(t), ",") {
		if b = strings.TrimSpace(b); b != "" {
			out = append(out, b)
		}
	}
	return out
}

// KafkaClient returns a franz-go client seeded with the test broker. opts
// come after kgo.SeedBrokers, so they may add to or override it. The client
// is closed by t.Cleanup.
func KafkaClient(t testing.TB, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(Brokers(t)...)}, opts...)...)
	if err != nil {
		t.Fatalf("testenv: kgo.NewClient: %v", err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// AdminClient returns an admin client on its own KafkaClient; both are
// closed by t.Cleanup.
func AdminClient(t testing.TB) *kadm.Client {
	t.Helper()
	return kadm.NewClient(KafkaClient(t))
}

// CreateTopic creates a topic named TopicName(t, base) with the given
// partition count, replication factor 1 and topic configs (nil for broker
// defaults), waits until the broker reports it with leaders on every
// partition, and deletes it in t.Cleanup. It returns the name. The test
// broker runs with auto.create.topics.enable=false, as production should,
// so tests create their topics explicitly (this or topicadmin.Ensure).
func CreateTopic(t testing.TB, base string, partitions int32, configs map[string]*string) string {
	t.Helper()
	name := TopicName(t, base)
	adm := AdminClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	resp, err := adm.CreateTopic(ctx, partitions, 1, configs, name)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatalf("testenv: create topic %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		// Best effort: a leftover topic only costs the shared broker a
		// little disk, and the broker may be down in a fault test.
		_, _ = adm.DeleteTopics(ctx, name)
	})
	for {
		md, err := adm.Metadata(ctx, name)
		if err == nil {
			if td, ok := md.Topics[name]; ok && td.Err == nil && len(td.Partitions) == int(partitions) && allLed(td) {
				return name
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("testenv: topic %s not ready: %v", name, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func allLed(td kadm.TopicDetail) bool {
	for _, p := range td.Partitions {
		if p.Err != nil || p.Leader < 0 {
			return false
		}
	}
	return true
}

// RedisClient returns a go-redis client for Redis(t), closed by t.Cleanup, that may
// touch only this test's keys: it logs in as an ACL user of its own, created here and
// deleted by t.Cleanup, allowed the keys of KeyPrefix(t) (any key starting "test:" and
// the test's name) and every command but the dangerous ones (CLIENT PAUSE, FLUSHALL,
// CONFIG, DEBUG, KEYS …), INFO excepted. The server is shared by every test package
// running at once: a key outside the test's space, or a command that stalls or wipes the
// server, fails with NOPERM instead of meeting another test. A test that must pause or
// kill Redis starts a redis-server of its own (StartRedisServer).
func RedisClient(t testing.TB) *redis.Client {
	t.Helper()
	addr := Redis(t)
	ctx := context.Background()
	admin := redis.NewClient(&redis.Options{Addr: addr})
	defer admin.Close()
	user, pass := "test-"+randHex(t), randHex(t)
	pattern := "~" + keySpace(t) + "*"
	if err := admin.Do(ctx, "ACL", "SETUSER", user, "on", ">"+pass, "resetkeys", pattern, "resetchannels",
		"+@all", "-@dangerous", "+info").Err(); err != nil {
		t.Fatalf("testenv: create the Redis user of %s: %v", t.Name(), err)
	}
	t.Cleanup(func() {
		a := redis.NewClient(&redis.Options{Addr: addr})
		defer a.Close()
		_ = a.Do(context.Background(), "ACL", "DELUSER", user).Err()
	})
	c := redis.NewClient(&redis.Options{Addr: addr, Username: user, Password: pass})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// maxTopicLen keeps names well under Kafka's limit of 249 characters.
const maxTopicLen = 200

// TopicName returns a Kafka topic name unique to this call: base, the
// sanitized test name and 16 random hex digits, joined by "-", at most 200
// characters of [a-zA-Z0-9._-]. Characters outside that set become "-".
func TopicName(t testing.TB, base string) string {
	t.Helper()
	base = sanitize(base, true)
	suffix := randHex(t)
	name := sanitize(t.Name(), false)
	if room := maxTopicLen - len(base) - len(suffix) - 2; len(name) > room {
		name = name[:max(room, 0)]
	}
	var b strings.Builder
	for _, part := range []string{base, name, suffix} {
		if part == "" {
			continue
		}
		if b.Len() > 0 {
			b.WriteByte('-')
		}
		b.WriteString(part)
	}
	out := b.String()
	if len(out) > maxTopicLen {
		out = out[len(out)-maxTopicLen:]
	}
	return out
}

// KeyPrefix returns a Redis key prefix unique to this call, ending in ":",
// e.g. "test:TestFoo-sub:1a2b3c4d5e6f7a8b:".
func KeyPrefix(t testing.TB) string {
	t.Helper()
	return keySpace(t) + ":" + randHex(t) + ":"
}

// keySpace is the start of every KeyPrefix of t: "test:" and t's sanitized name.
func keySpace(t testing.TB) string {
	name := sanitize(t.Name(), false)
	if len(name) > 100 {
		name = name[:100]
	}
	return "test:" + name
}

// sanitize maps s onto Kafka's topic alphabet. Test names contain "/" and
// spaces; dots are kept only in base names, since Kafka treats "." and "_"
// as colliding in metric names and test names need neither.
func sanitize(s string, keepDots bool) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_':
			return r
		case r == '.' && keepDots:
			return r
		}
		return '-'
	}, s)
}

func randHex(t testing.TB) string {
	t.Helper()
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatalf("testenv: crypto/rand: %v", err)
	}
	return hex.EncodeToString(b[:])
}
