package server

import (
	"context"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// TestHandlerPanicLoggedAsError: net/http recovers a handler's panic and closes the
// connection, so the client sees only EOF; the panic must reach the log as an error, with
// its stack, while the client-caused messages stay at debug level.
func TestHandlerPanicLoggedAsError(t *testing.T) {
	rec := &records{}
	logger := slog.New(rec)
	ts := httptest.NewUnstartedServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		panic("decision state corrupted")
	}))
	ts.Config.ErrorLog = log.New(httpErrorLog{logger}, "", 0)
	ts.Start()
	defer ts.Close()

	resp, err := http.Post(ts.URL+"/v1/check", "application/json", strings.NewReader("{}"))
	if err == nil {
		resp.Body.Close()
		t.Fatalf("a panicking handler answered %s", resp.Status)
	}
	ts.Close() // the error log is written before the connection closes; Close waits for it

	_, _ = httpErrorLog{logger}.Write([]byte("http: TLS handshake error from 192.0.2.1:4242: EOF\n"))
	got := rec.all()
	if len(got) != 2 {
		t.Fatalf("got %d log records, want 2: %v", len(got), got)
	}
	if got[0].Level != slog.LevelError || !strings.Contains(got[0].Message, "panic serving") ||
		!strings.Contains(got[0].Message, "decision state corrupted") || !strings.Contains(got[0].Message, "goroutine") {
		t.Errorf("the panic was logged at %v as %q, want an error with the value and the stack", got[0].Level, firstLine(got[0].Message))
	}
	if got[1].Level != slog.LevelDebug {
		t.Errorf("a client's TLS handshake error was logged at %v, want debug", got[1].Level)
	}
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// records is a slog.Handler that keeps every record.
type records struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (h *records) Enabled(context.Context, slog.Level) bool { return true }
func (h *records) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.recs = append(h.recs, r)
	return nil
}
func (h *records) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *records) WithGroup(string) slog.Handler      { return h }

func (h *records) all() []slog.Record {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]slog.Record(nil), h.recs...)
}
