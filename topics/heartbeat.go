package topics

import (
	"strconv"
	"strings"
	"time"
)

// HeartbeatPrefix starts the key of every heartbeat record in the counts topic.
const HeartbeatPrefix = ReservedPrefix + "hb/"

// InstanceHeader is the Kafka record header in which an aggregator names itself (its
// instance ID, as in its heartbeats) on every record it writes to the counts topic: counts,
// tombstones and heartbeats. An enforcer configured with the aggregators' names believes
// only records that carry one of them. It identifies, it does not authenticate: who may
// write the topic at all is the brokers' ACLs' to say (docs/hardening.md).
const InstanceHeader = "streamlimit-instance"

// HeartbeatKey returns the counts-topic key of the heartbeat that describes the aggregator's
// progress on one partition of a hits topic: "__streamlimit/hb/<topic>/<partition>".
// Because the key names the source partition and not the aggregator instance, the
// compacted topic keeps exactly one heartbeat per source partition however often the
// partition changes owner.
func HeartbeatKey(topic string, partition int32) string {
	return HeartbeatPrefix + topic + "/" + strconv.FormatInt(int64(partition), 10)
}

// IsHeartbeatKey reports whether a counts-topic key is a heartbeat's.
func IsHeartbeatKey(key []byte) bool { return strings.HasPrefix(string(key), HeartbeatPrefix) }

// IsReservedKey reports whether a counts-topic key is streamlimit's own (not a counter).
func IsReservedKey(key []byte) bool { return strings.HasPrefix(string(key), ReservedPrefix) }

// Heartbeat reports an aggregator's progress on one source partition of a hits topic. It is
// written to the counts topic at least once a second, as JSON, under HeartbeatKey.
type Heartbeat struct {
	// Instance names the aggregator instance that wrote it.
	Instance string `json:"instance"`
	// Topic and Partition name the hits partition this heartbeat is about.
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	// AsOf is the aggregator's clock when it wrote the heartbeat, in unix milliseconds.
	// Counts for keys of this partition are at least this fresh, up to Lag.
	AsOf int64 `json:"asof"`
	// Offset is the next offset the aggregator will consume from the partition.
	Offset int64 `json:"offset"`
	// HighWatermark is the partition's end offset as last seen by the aggregator;
	// HighWatermark − Offset is the consume lag in records.
	HighWatermark int64 `json:"hwm"`
	// Replaying is true while the aggregator rebuilds the partition's state after an
	// assignment and publishes no counts for it. Readers take such a source as stale.
	// Aggregators no longer write one: they write no heartbeat of a partition while they
	// replay it, so that its latest heartbeat is the previous owner's, whose counts were
	// complete, and says how fresh they are.
	Replaying bool `json:"replaying,omitempty"`
	// Sites holds, for every site heard from on this partition, the time (unix ms, the
	// site's clock) up to which the aggregator has counted that site's hits here: the
	// latest site heartbeat (Hit.IsSiteHeartbeat) or hit bucket it consumed. A site whose
	// time falls behind is one whose hits have stopped arriving — a cut link, a stopped
	// replicator, a data center down — and readers must not take its silence for idleness.
	Sites map[string]int64 `json:"sites,omitempty"`
	// Left holds, for every site whose instances heard from on this partition have all
	// left (site leave records, Hit.IsSiteLeave), the time it left (unix ms, the site's
	// clock). A site is in Sites or in Left, never both; it stays in Left until a
	// heartbeat of it arrives again (a restart) or the aggregator forgets it. Its hits
	// still count until they leave their windows, but it admits nothing more, so readers
	// reserve nothing for it.
	Left map[string]int64 `json:"left,omitempty"`
	// Conflicts lists the sites that two or more live producer instances announce while
	// counting apart (at least one of them in its own process): each would admit the
	// site's whole share. It is the same in every heartbeat of one aggregator instance.
	Conflicts []string `json:"conflicts,omitempty"`
}

// AsOfTime returns AsOf as a time.Time.
func (h Heartbeat) AsOfTime() time.Time { return time.UnixMilli(h.AsOf) }

// MarshalBinary encodes h for the counts topic (JSON: heartbeats are few, and readable with
// any consumer).
func (h Heartbeat) MarshalBinary() ([]byte, error) {
	if h.Topic == "" {
		return nil, errorf(ErrEmptyKey, "heartbeat without topic")
	}
	return jsonMarshal(h)
}

// DecodeHeartbeat decodes a heartbeat value.
func DecodeHeartbeat(b []byte) (Heartbeat, error) {
	var h Heartbeat
	if len(b) == 0 || b[0] != jsonStart {
		return h, errorf(ErrUnknownVersion, "heartbeat is not a JSON object")
	}
	if err := decodeJSONStrict(b, &h); err != nil {
		return Heartbeat{}, err
	}
	if h.Topic == "" {
		return Heartbeat{}, errorf(ErrEmptyKey, "heartbeat without topic")
	}
	return h, nil
}
