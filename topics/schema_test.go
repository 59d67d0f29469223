package topics

import (
	"encoding/json"
	"maps"
	"os"
	"slices"
	"testing"
)

// schema is the part of a JSON Schema that the records' schemas in docs/schemas use.
type schema struct {
	Required             []string
	DependentRequired    map[string][]string
	AdditionalProperties bool
	Properties           map[string]struct{ Type string }
}

func loadSchema(t *testing.T, name string) schema {
	t.Helper()
	b, err := os.ReadFile("../docs/schemas/" + name)
	if err != nil {
		t.Fatal(err)
	}
	var s schema
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	return s
}

// checkSchema checks that decode agrees with s on full, a record with every property of
// s: full decodes; without any one required property, with an unknown property, or with
// a fraction in an integer property, it does not; without an optional one (and the ones
// that depend on it), it does; an unknown property is ignored exactly when the schema
// allows additional properties.
func checkSchema(t *testing.T, s schema, full map[string]any, decode func([]byte) error) {
	t.Helper()
	if got, want := slices.Sorted(maps.Keys(full)), slices.Sorted(maps.Keys(s.Properties)); !slices.Equal(got, want) {
		t.Fatalf("test record has %v, schema properties are %v", got, want)
	}
	enc := func(m map[string]any) []byte {
		b, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	if err := decode(enc(full)); err != nil {
		t.Fatalf("a record with every schema property does not decode: %v\n%s", err, enc(full))
	}
	for name, p := range s.Properties {
		m := maps.Clone(full)
		delete(m, name)
		for dep, on := range s.DependentRequired {
			if slices.Contains(on, name) {
				delete(m, dep)
			}
		}
		err := decode(enc(m))
		if required := slices.Contains(s.Required, name); required != (err != nil) {
			t.Errorf("without %q (required %v): decode error %v", name, required, err)
		}
		if p.Type == "integer" {
			m := maps.Clone(full)
			m[name] = 1.5
			if decode(enc(m)) == nil {
				t.Errorf("%q: a fraction in an integer property decodes", name)
			}
		}
	}
	m := maps.Clone(full)
	m["extra"] = 1
	if err := decode(enc(m)); (err == nil) != s.AdditionalProperties {
		t.Errorf("a record with an unknown property: decode error %v, schema additionalProperties %v", err, s.AdditionalProperties)
	}
	for dep, on := range s.DependentRequired {
		for _, o := range on {
			m := maps.Clone(full)
			delete(m, o)
			if decode(enc(m)) == nil {
				t.Errorf("%q without %q decodes", dep, o)
			}
		}
	}
}

// TestHitSchema keeps docs/schemas/hit.schema.json true to DecodeHit.
func TestHitSchema(t *testing.T) {
	full := map[string]any{"key": "api|user=42#60s", "site": "eu-1", "ts": 1763740000123, "w": 60000, "n": 1, "d": 2,
		"instance": "eu-1-pod-7", "counter": "redis:redis-eu:6379"}
	checkSchema(t, loadSchema(t, "hit.schema.json"), full, func(b []byte) error { _, err := DecodeHit(b); return err })
}

// TestCountSchema keeps docs/schemas/count.schema.json true to DecodeCount and to the
// JSON that Count.MarshalJSON writes.
func TestCountSchema(t *testing.T) {
	s := loadSchema(t, "count.schema.json")
	c := Count{Key: "api|user=42#60s", Window: 60000, AsOf: 1763740000123, Total: 6.5, SubBuckets: 60,
		Sites: []SiteCount{{Site: "eu-1", Count: 3.5, Demand: 2.2}, {Site: "us-1", Count: 3, Demand: 0.4}}}
	b, err := c.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	var written map[string]any
	if err := json.Unmarshal(b, &written); err != nil {
		t.Fatal(err)
	}
	checkSchema(t, s, written, func(b []byte) error { _, err := DecodeCount(b); return err })
}
