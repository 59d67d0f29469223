package aggregator

import (
	"errors"
	"testing"
	"time"

	"github.com/streamlimit/streamlimit/topics"
	"github.com/streamlimit/streamlimit/window"
)

func TestMemoryCountsLikeTheReference(t *testing.T) {
	m, err := NewMemory(MemoryConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	const key = "api|user=1#10s"
	var hits []topics.Hit
	for i := range 30 {
		h := topics.Hit{Key: key, Site: []string{"eu", "us"}[i%2], BucketStart: t0.UnixMilli() + int64(i)*300, Window: 10000, Count: int64(1 + i%3)}
		hits = append(hits, h)
		if err := m.Add(t0.Add(time.Duration(i)*300*time.Millisecond), h); err != nil {
			t.Fatal(err)
		}
	}
	now := t0.Add(12 * time.Second)
	out := m.Emit(now)
	if len(out) != 2 {
		t.Fatalf("want one count and one heartbeat, got %d records", len(out))
	}
	c, err := topics.DecodeCount(out[0].Value)
	if err != nil || string(out[0].Key) != key {
		t.Fatalf("count record %q: %v", out[0].Key, err)
	}
	want, sites := window.Reference(window.NewSpec(10*time.Second, 60, 30*time.Second), hits, now.UnixMilli())
	if c.Total != want || c.Site("eu") != sites["eu"] || c.Site("us") != sites["us"] || c.AsOf != now.UnixMilli() {
		t.Fatalf("count %+v, want total %v sites %v as of %d", c, want, sites, now.UnixMilli())
	}
	hb, err := topics.DecodeHeartbeat(out[1].Value)
	if err != nil || string(out[1].Key) != topics.HeartbeatKey(topics.DefaultHitsTopic, 0) || hb.AsOf != now.UnixMilli() || hb.Offset != 30 {
		t.Fatalf("heartbeat %q %+v: %v", out[1].Key, hb, err)
	}
	// Nothing changed 100 ms later, and the heartbeat is not due yet.
	if out := m.Emit(now.Add(100 * time.Millisecond)); len(out) != 0 && out[0].Value != nil {
		if got, _ := topics.DecodeCount(out[0].Value); got.Total == c.Total {
			t.Fatalf("unchanged count re-emitted: %+v", out)
		}
	}
	// Once every hit has left the window the key gets a tombstone and is forgotten.
	late := t0.Add(30 * time.Second)
	out = m.Emit(late)
	if len(out) != 2 || out[0].Value != nil || string(out[0].Key) != key || m.Keys() != 0 {
		t.Fatalf("want a tombstone and a heartbeat, got %d records, keys %d", len(out), m.Keys())
	}
}

func TestMemoryRejectsLikeKafkaPath(t *testing.T) {
	m, err := NewMemory(MemoryConfig{MaxKeys: 1})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ms := now.UnixMilli()
	for _, tc := range []struct {
		hit    topics.Hit
		reason string
	}{
		{topics.Hit{Key: "", Site: "eu", BucketStart: ms, Window: 1000, Count: 1}, topics.Reason(topics.ErrEmptyKey)},
		{topics.Hit{Key: "k", Site: "eu", BucketStart: ms + time.Minute.Milliseconds(), Window: 1000, Count: 1}, ReasonTooFarFuture},
		{topics.Hit{Key: "k", Site: "eu", BucketStart: ms - time.Minute.Milliseconds(), Window: 1000, Count: 1}, ReasonTooOld},
		{topics.Hit{Key: "k", Site: "eu", BucketStart: ms, Window: 2 * time.Hour.Milliseconds(), Count: 1}, ReasonWindowTooLong},
	} {
		var bad *BadHitError
		if err := m.Add(now, tc.hit); !errors.As(err, &bad) || bad.Reason != tc.reason {
			t.Errorf("%+v: got %v, want reason %s", tc.hit, err, tc.reason)
		}
	}
	if err := m.Add(now, topics.Hit{Key: "a", Site: "eu", BucketStart: ms, Count: 1}); err != nil {
		t.Fatal(err) // window 0: the default window applies
	}
	if err := m.Add(now, topics.Hit{Key: "b", Site: "eu", BucketStart: ms, Count: 1}); !errors.Is(err, ErrRefused) {
		t.Fatalf("second key beyond MaxKeys 1: %v", err)
	}
	if _, err := NewMemory(MemoryConfig{EmitInterval: time.Microsecond}); err == nil {
		t.Fatal("EmitInterval 1µs accepted")
	}
}
