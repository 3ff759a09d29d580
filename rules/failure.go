package rules

import (
	"fmt"
	"strconv"
)

// FailurePolicy says how a domain's requests are answered when the store
// fails (an error from sluice.Store.Take: Redis down, a deadline exceeded,
// an open circuit breaker). A domain sets it with the `failure_policy:`
// extension key; the server's default covers the domains that do not.
type FailurePolicy uint8

const (
	// FailDefault: the domain sets no policy; the server's default applies.
	FailDefault FailurePolicy = iota
	// FailOpen answers every descriptor OK, as if no limit applied.
	FailOpen
	// FailClosed answers every limited descriptor OVER_LIMIT.
	FailClosed
	// FailLocal keeps limiting on the node's own store, each limit divided
	// by the number of nodes.
	FailLocal
)

var failureNames = [...]string{"default", "fail_open", "fail_closed", "local"}

// failurePolicies is the list of policy names for messages.
const failurePolicies = "fail_open, fail_closed, local"

// String returns the policy's name as written in rules files: "fail_open",
// "fail_closed", "local", or "default" for FailDefault.
func (p FailurePolicy) String() string {
	if int(p) < len(failureNames) {
		return failureNames[p]
	}
	return "rules.FailurePolicy(" + strconv.Itoa(int(p)) + ")"
}

// ParseFailurePolicy returns the policy named s: "fail_open", "fail_closed"
// or "local". "default" is not a policy one can ask for.
func ParseFailurePolicy(s string) (FailurePolicy, error) {
	for p := FailOpen; int(p) < len(failureNames); p++ {
		if s == failureNames[p] {
			return p, nil
		}
	}
	return FailDefault, fmt.Errorf("unknown failure_policy %q (want one of %s)", s, failurePolicies)
}

// MarshalText returns the policy's name, for encoding and the flag package
// (flag.TextVar).
func (p FailurePolicy) MarshalText() ([]byte, error) {
	if int(p) >= len(failureNames) {
		return nil, fmt.Errorf("invalid %s", p)
	}
	return []byte(p.String()), nil
}

// UnmarshalText sets p to the policy named by text, as ParseFailurePolicy.
func (p *FailurePolicy) UnmarshalText(text []byte) error {
	v, err := ParseFailurePolicy(string(text))
	if err != nil {
		return err
	}
	*p = v
	return nil
}
