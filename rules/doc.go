// Package rules loads rate limiting rules in the YAML format of
// envoyproxy/ratelimit, plus the sluice extensions, and matches request
// descriptors against them.
//
// It owns the rules format: parsing with every problem reported at its line
// and column ([Parse], [LoadFile], [LoadDir]), the immutable [Config] that
// holds the domains, and the matching of a request's descriptors to the
// limits that apply ([Config.Plan]), with the counter keys the store uses.
// docs/rules.md describes the format and where sluice differs from Envoy.
//
// Matching follows envoyproxy/ratelimit: each descriptor walks the rule
// tree entry by entry, trying at every level the exact key and value, then
// the wildcard values (in file order, the first that matches), then the
// value-less rule for the key; the rule reached by the last entry applies.
// A wildcard value has '*' anywhere, each matching any run of characters;
// Envoy only knows the trailing '*' (a prefix), which sluice matches alike.
//
// This package imports the root package, the algo package, go.yaml.in/yaml/v3
// and the standard library. It must not import stores or transports: the
// transports convert their requests (Envoy RLS protos, HTTP attributes) into
// [Descriptor] values and hand the [Plan] to a sluice.Limiter.
package rules
