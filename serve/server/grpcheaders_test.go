package server_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/streamlimit/streamlimit/serve/server"
)

// TestGRPCMetadataBound: every gRPC server of the enforcer (the rate-limit service and
// RLQS) announces the HTTP header bound, DefaultMaxHeaderBytes, as its largest header
// list, and resets a call whose metadata exceeds it even from a client that ignores the
// announcement; a gRPC client is refused such a call, and a normal call still passes.
// Before, grpc-go's own bound applied: 16 MiB of metadata a call.
func TestGRPCMetadataBound(t *testing.T) {
	srv := startServer(t, server.Config{GRPCAddr: "127.0.0.1:0", RLQSAddr: "127.0.0.1:0"})
	// 40 fields of 1 KiB: each within any per-field bound, together past the list's.
	var big []string
	for i := range 40 {
		big = append(big, "x-pad-"+strconv.Itoa(i), strings.Repeat("x", 1<<10))
	}
	for name, addr := range map[string]string{"rls": srv.GRPCAddr(), "rlqs": srv.RLQSAddr()} {
		announced, refused := rawOversizedCall(t, addr, big)
		if announced != server.DefaultMaxHeaderBytes {
			t.Errorf("%s: SETTINGS_MAX_HEADER_LIST_SIZE %d, want %d", name, announced, server.DefaultMaxHeaderBytes)
		}
		if !refused {
			t.Errorf("%s: a call with 40 KiB of metadata was answered", name)
		}
	}

	conn, err := grpc.NewClient(srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := rlsv3.NewRateLimitServiceClient(conn)
	req := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: "md"}}}}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	normal := metadata.AppendToOutgoingContext(ctx, "x-request-id", "abc")
	if _, err := client.ShouldRateLimit(normal, req); err != nil {
		t.Fatalf("a call with normal metadata: %v", err)
	}
	if _, err := client.ShouldRateLimit(metadata.AppendToOutgoingContext(ctx, big...), req); err == nil {
		t.Error("a call with 40 KiB of metadata was answered")
	}
	if _, err := client.ShouldRateLimit(normal, req); err != nil {
		t.Errorf("a normal call after the refused one: %v", err)
	}
}

// rawOversizedCall opens an HTTP/2 connection to the gRPC server at addr and sends a
// whole call (an empty message) whose metadata holds the pairs of big, ignoring the
// server's announced bound. It returns the header list bound the server announced and
// whether the server refused the call: reset its stream or closed the connection,
// where the server that takes the metadata answers with headers.
func rawOversizedCall(t *testing.T, addr string, big []string) (announced uint32, refused bool) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(c, c)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	fields := []hpack.HeaderField{
		{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "http"},
		{Name: ":path", Value: "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"},
		{Name: ":authority", Value: addr}, {Name: "content-type", Value: "application/grpc"},
		{Name: "te", Value: "trailers"},
	}
	for i := 0; i+1 < len(big); i += 2 {
		fields = append(fields, hpack.HeaderField{Name: big[i], Value: big[i+1]})
	}
	for _, f := range fields {
		if err := enc.WriteField(f); err != nil {
			t.Fatal(err)
		}
	}
	sent := false
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			// Closed after the call was sent: refused. A timeout is no answer at all.
			return announced, sent && errors.Is(err, io.EOF)
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if f.IsAck() {
				continue
			}
			if v, ok := f.Value(http2.SettingMaxHeaderListSize); ok {
				announced = v
			}
			if err := fr.WriteSettingsAck(); err != nil {
				t.Fatal(err)
			}
			if !sent {
				sent = true
				writeHeaderBlock(t, fr, 1, block.Bytes())
				// An empty message ends the call, so that a server that took the
				// metadata answers at once.
				if err := fr.WriteData(1, true, []byte{0, 0, 0, 0, 0}); err != nil {
					t.Fatal(err)
				}
			}
		case *http2.RSTStreamFrame:
			return announced, f.StreamID == 1
		case *http2.GoAwayFrame:
			return announced, true
		case *http2.HeadersFrame:
			return announced, false
		}
	}
}

// writeHeaderBlock writes block as stream id's headers: a HEADERS frame, then as many
// CONTINUATION frames as HTTP/2's default frame size needs.
func writeHeaderBlock(t *testing.T, fr *http2.Framer, id uint32, block []byte) {
	t.Helper()
	const frame = 16 << 10
	first := block[:min(frame, len(block))]
	rest := block[len(first):]
	if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: first, EndHeaders: len(rest) == 0}); err != nil {
		t.Fatal(err)
	}
	for len(rest) > 0 {
		n := min(frame, len(rest))
		if err := fr.WriteContinuation(id, n == len(rest), rest[:n]); err != nil {
			t.Fatal(err)
		}
		rest = rest[n:]
	}
}
