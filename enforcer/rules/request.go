package rules

import (
	"fmt"
	"math"
	"strconv"
)

// Bounds on one request to decide, the same at every front door (the HTTP check API and
// Envoy's gRPC service), so that a request one accepts the other accepts too.
const (
	// MaxRequestDescriptors is the most descriptors one request may carry.
	MaxRequestDescriptors = 64
	// MaxDescriptorEntries is the most entries one descriptor may carry.
	MaxDescriptorEntries = 32
	// MaxHits is the largest cost (hits_addend) of a request or a descriptor: Envoy's
	// request field is a uint32, and so is every front door's bound, although a
	// descriptor's own hits_addend is a uint64 in Envoy's protocol.
	MaxHits = math.MaxUint32
)

// RequestError says why a request to decide is invalid. Field names the offending part
// as in the JSON form of Envoy's RateLimitRequest ("descriptors[0].entries[1].key").
type RequestError struct {
	Field  string
	Reason string
}

func (e *RequestError) Error() string { return e.Field + ": " + e.Reason }

// ValidateRequest checks a request to decide as every front door must before it decides:
// a domain, 1..MaxRequestDescriptors descriptors, each with 1..MaxDescriptorEntries
// entries, each with a key (a value may be empty). It returns a *RequestError for the
// first problem, or nil.
func ValidateRequest(domain string, descriptors [][]Entry) error {
	switch {
	case domain == "":
		return &RequestError{"domain", "required"}
	case len(descriptors) == 0:
		return &RequestError{"descriptors", "at least one is required"}
	case len(descriptors) > MaxRequestDescriptors:
		return &RequestError{"descriptors", fmt.Sprintf("%d is more than %d", len(descriptors), MaxRequestDescriptors)}
	}
	// The field's name is built only for an error: on every valid request it would be one
	// allocation per descriptor.
	field := func(i int) string { return "descriptors[" + strconv.Itoa(i) + "].entries" }
	for i, d := range descriptors {
		switch {
		case len(d) == 0:
			return &RequestError{field(i), "at least one is required"}
		case len(d) > MaxDescriptorEntries:
			return &RequestError{field(i), fmt.Sprintf("%d is more than %d", len(d), MaxDescriptorEntries)}
		}
		for j, e := range d {
			if e.Key == "" {
				return &RequestError{field(i) + "[" + strconv.Itoa(j) + "].key", "required"}
			}
		}
	}
	return nil
}
