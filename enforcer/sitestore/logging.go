package sitestore

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
)

// GoRedisLogger sends go-redis's own log lines (connection pool and dial failures, which
// it otherwise prints with the standard library's log package) to a slog.Logger, at Warn,
// so that they come out in the process's format (JSON with --log-format json). Install it
// once at start-up with redis.SetLogger: go-redis keeps one logger per process.
type GoRedisLogger struct {
	// Logger receives the lines. Default (nil): slog.Default().
	Logger *slog.Logger
}

// Printf implements go-redis's logging interface.
func (g GoRedisLogger) Printf(ctx context.Context, format string, v ...any) {
	l := g.Logger
	if l == nil {
		l = slog.Default()
	}
	l.WarnContext(ctx, "redis client", "detail", strings.TrimSpace(fmt.Sprintf(format, v...)))
}

// authError reports whether err is Redis refusing this client's credentials or rights.
func authError(err error) bool {
	msg := err.Error()
	for _, p := range []string{"WRONGPASS", "NOAUTH", "NOPERM", "ERR AUTH", "ERR invalid password"} {
		if strings.Contains(msg, p) {
			return true
		}
	}
	return false
}

// noteAuthFailure logs an authentication failure once per run of them: every call fails
// the same way until the credentials or ACL are fixed, and one clear line says why.
func (s *Store) noteAuthFailure(err error) {
	if s.authFailing.CompareAndSwap(false, true) {
		s.log.Error("sitestore: redis refused this enforcer's credentials; site limits are decided in process until it accepts them",
			"reason", err.Error())
	}
}
