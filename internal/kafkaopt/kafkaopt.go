// Package kafkaopt turns streamlimit's Kafka security settings (TLS, SASL PLAIN and SCRAM)
// into franz-go client options, so that the producer, the aggregator, the enforcer and the
// CLI configure secure connections the same way.
package kafkaopt

import (
	"crypto/tls"
	"errors"
	"fmt"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// SASL mechanism names accepted in Security.SASLMechanism (case-insensitive).
const (
	MechanismPlain       = "PLAIN"
	MechanismScramSHA256 = "SCRAM-SHA-256"
	MechanismScramSHA512 = "SCRAM-SHA-512"
)

// ErrBadSecurity is wrapped by every error Security.Opts returns.
var ErrBadSecurity = errors.New("invalid Kafka security settings")

// Security describes how a client authenticates to Kafka and protects its connections.
// The zero value means plaintext without authentication.
type Security struct {
	// TLS, when non-nil, makes every broker connection use TLS with this configuration
	// (it is cloned; ServerName is filled per broker by franz-go when empty). Nil means
	// plaintext.
	TLS *tls.Config
	// SASLMechanism is "" (no SASL, the default), "PLAIN", "SCRAM-SHA-256" or
	// "SCRAM-SHA-512". PLAIN sends the password in clear: use it only with TLS.
	SASLMechanism string
	// User and Password are the SASL credentials; both are required when SASLMechanism
	// is set and must be empty otherwise.
	User, Password string
}

// Opts returns the kgo options that implement s: kgo.DialTLSConfig when TLS is set and
// kgo.SASL with the chosen mechanism. It returns no options for the zero Security, and an
// error wrapping ErrBadSecurity for an unknown mechanism or missing or stray credentials.
func (s Security) Opts() ([]kgo.Opt, error) {
	var opts []kgo.Opt
	if s.TLS != nil {
		opts = append(opts, kgo.DialTLSConfig(s.TLS.Clone()))
	}
	mech := strings.ToUpper(strings.TrimSpace(s.SASLMechanism))
	if mech == "" {
		if s.User != "" || s.Password != "" {
			return nil, fmt.Errorf("%w: SASL user or password given without a SASL mechanism", ErrBadSecurity)
		}
		return opts, nil
	}
	if s.User == "" || s.Password == "" {
		return nil, fmt.Errorf("%w: SASL mechanism %s needs a user and a password", ErrBadSecurity, mech)
	}
	switch mech {
	case MechanismPlain:
		opts = append(opts, kgo.SASL(plain.Auth{User: s.User, Pass: s.Password}.AsMechanism()))
	case MechanismScramSHA256:
		opts = append(opts, kgo.SASL(scram.Auth{User: s.User, Pass: s.Password}.AsSha256Mechanism()))
	case MechanismScramSHA512:
		opts = append(opts, kgo.SASL(scram.Auth{User: s.User, Pass: s.Password}.AsSha512Mechanism()))
	default:
		return nil, fmt.Errorf("%w: unknown SASL mechanism %q (want %s, %s or %s)",
			ErrBadSecurity, s.SASLMechanism, MechanismPlain, MechanismScramSHA256, MechanismScramSHA512)
	}
	return opts, nil
}

// Warnings lists what is valid in s but unsafe, for the caller to log: SASL PLAIN without
// TLS sends the password in clear to anyone on the path.
func (s Security) Warnings() []string {
	if s.TLS == nil && strings.EqualFold(strings.TrimSpace(s.SASLMechanism), MechanismPlain) {
		return []string{"SASL PLAIN without TLS sends the Kafka password in clear: enable TLS"}
	}
	return nil
}

// String describes s without its password, for logs.
func (s Security) String() string {
	var b strings.Builder
	if s.TLS != nil {
		b.WriteString("tls")
	} else {
		b.WriteString("plaintext")
	}
	if s.SASLMechanism != "" {
		fmt.Fprintf(&b, " sasl=%s user=%s", strings.ToUpper(s.SASLMechanism), s.User)
	}
	return b.String()
}
