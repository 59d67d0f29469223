package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"os"

	"github.com/spf13/cobra"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamlimit/streamlimit/internal/kafkaopt"
)

// kafkaFlags are the Kafka connection settings shared by every subcommand that talks to
// Kafka: brokers, TLS and SASL.
type kafkaFlags struct {
	brokers []string
	tls     tlsFlags
	sasl    struct{ mechanism, user, password string }
	// cmd receives the warnings of valid but unsafe settings on its error output.
	cmd *cobra.Command
}

func (k *kafkaFlags) register(cmd *cobra.Command) {
	k.cmd = cmd
	f := cmd.Flags()
	f.StringSliceVar(&k.brokers, "brokers", []string{"localhost:9092"}, "Kafka bootstrap brokers, comma separated (env STREAMLIMIT_BROKERS or STREAMLIMIT_KAFKA_BROKERS)")
	k.tls.register(cmd, "kafka")
	f.StringVar(&k.sasl.mechanism, "kafka-sasl-mechanism", "", "Kafka SASL mechanism: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512")
	f.StringVar(&k.sasl.user, "kafka-sasl-user", "", "Kafka SASL user")
	f.StringVar(&k.sasl.password, "kafka-sasl-password", "", "Kafka SASL password (prefer env STREAMLIMIT_KAFKA_SASL_PASSWORD)")
}

// security returns the TLS and SASL client options, without the seed brokers.
func (k *kafkaFlags) security() ([]kgo.Opt, error) {
	tc, err := k.tls.config()
	if err != nil {
		return nil, fmt.Errorf("kafka TLS: %w", err)
	}
	sec := kafkaopt.Security{TLS: tc, SASLMechanism: k.sasl.mechanism, User: k.sasl.user, Password: k.sasl.password}
	opts, err := sec.Opts()
	if err != nil {
		return nil, err
	}
	if w := sec.Warnings(); len(w) > 0 && k.cmd != nil {
		log := slog.New(slog.NewTextHandler(k.cmd.ErrOrStderr(), nil))
		for _, msg := range w {
			log.Warn(msg)
		}
	}
	return opts, nil
}

// opts returns the seed brokers and the security options.
func (k *kafkaFlags) opts() ([]kgo.Opt, error) {
	sec, err := k.security()
	if err != nil {
		return nil, err
	}
	return append([]kgo.Opt{kgo.SeedBrokers(k.brokers...)}, sec...), nil
}

// client returns a new Kafka client with the connection settings and extra options.
func (k *kafkaFlags) client(extra ...kgo.Opt) (*kgo.Client, error) {
	opts, err := k.opts()
	if err != nil {
		return nil, err
	}
	cl, err := kgo.NewClient(append(opts, extra...)...)
	if err != nil {
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	return cl, nil
}

// tlsFlags configure a TLS client: --<p>-tls turns it on, and so does a CA file (which
// replaces the system roots) or a client certificate (which, with its key, enables client
// authentication). A setting that would otherwise be ignored — a key without its
// certificate or the reverse, or skipping verification with TLS off — is an error, so that
// a connection the operator meant to secure never silently stays plaintext.
type tlsFlags struct {
	on                 bool
	ca, cert, key      string
	insecureSkipVerify bool
	p                  string // the flags' prefix, for errors
}

func (t *tlsFlags) register(cmd *cobra.Command, p string) {
	t.p = p
	f := cmd.Flags()
	f.BoolVar(&t.on, p+"-tls", false, "use TLS for "+p)
	f.StringVar(&t.ca, p+"-tls-ca", "", "PEM file of CA certificates to trust for "+p+" (default: the system's)")
	f.StringVar(&t.cert, p+"-tls-cert", "", "PEM client certificate for "+p)
	f.StringVar(&t.key, p+"-tls-key", "", "PEM client key for "+p)
	f.BoolVar(&t.insecureSkipVerify, p+"-tls-insecure-skip-verify", false, "do not verify "+p+"'s certificate (testing only)")
}

// config returns nil when TLS is off.
func (t *tlsFlags) config() (*tls.Config, error) {
	if (t.cert == "") != (t.key == "") {
		return nil, fmt.Errorf("--%[1]s-tls-cert and --%[1]s-tls-key go together: give both or neither", t.p)
	}
	if !t.on && t.ca == "" && t.cert == "" {
		if t.insecureSkipVerify {
			return nil, fmt.Errorf("--%[1]s-tls-insecure-skip-verify without TLS: add --%[1]s-tls", t.p)
		}
		return nil, nil
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: t.insecureSkipVerify} //nolint:gosec // opt-in flag
	if t.ca != "" {
		pem, err := os.ReadFile(t.ca)
		if err != nil {
			return nil, err
		}
		c.RootCAs = x509.NewCertPool()
		if !c.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s: no PEM certificates", t.ca)
		}
	}
	if t.cert != "" || t.key != "" {
		pair, err := tls.LoadX509KeyPair(t.cert, t.key)
		if err != nil {
			return nil, err
		}
		c.Certificates = []tls.Certificate{pair}
	}
	return c, nil
}
