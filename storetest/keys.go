package storetest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/base/algo"
)

// keyIsolation: keys do not share state, however alike.
func (s suite) keyIsolation(t *testing.T) {
	s.forKinds(t, func(t *testing.T, e *env, k algo.Kind) {
		l := &sluice.Limit{Algorithm: sluice.Algorithm(k), Rate: 2, Period: time.Minute}
		keys := []string{"a", "b", "", "a\x00", "A", "ab", "ba"}
		for _, key := range keys {
			want(t, fmt.Sprintf("key %q", key), e.allow(key, l, 2), true, 0)
		}
		for _, key := range keys {
			want(t, fmt.Sprintf("key %q again", key), e.allow(key, l, 1), false, 0)
		}
	})
}

// limitsShareKeyString: different limits given the same key string keep
// separate state.
func (s suite) limitsShareKeyString(t *testing.T) {
	e := s.env(t)
	sec := &sluice.Limit{Name: "sec", Rate: 1, Period: time.Second}
	day := &sluice.Limit{Name: "day", Rate: 100, Period: 24 * time.Hour}
	want(t, "per second", e.allow("k", sec, 1), true, 0)
	want(t, "per second again", e.allow("k", sec, 1), false, 0)
	want(t, "per day on the same key string", e.allow("k", day, 1), true, 99)
	for _, k := range algo.Kinds() {
		l := &sluice.Limit{Name: "x", Algorithm: sluice.Algorithm(k), Rate: 1, Period: time.Second}
		if k == algo.FixedWindow {
			l.Rate = 2 // differs from sec
		}
		want(t, k.String()+" on the same key string", e.allow("k", l, 1), true, l.Rate-1)
	}
}

// longKeys: keys up to MaxKeyLen work, and differ by any byte.
func (s suite) longKeys(t *testing.T) {
	e := s.env(t)
	l := &sluice.Limit{Rate: 1, Period: time.Minute}
	base := strings.Repeat("k", sluice.MaxKeyLen)
	keys := []string{
		base,
		base[:sluice.MaxKeyLen-1] + "x",
		"x" + base[1:],
		base[:sluice.MaxKeyLen/2] + "x" + base[sluice.MaxKeyLen/2+1:],
		base[:sluice.MaxKeyLen-1],
	}
	for i, key := range keys {
		want(t, fmt.Sprintf("long key %d", i), e.allow(key, l, 1), true, 0)
	}
	for i, key := range keys {
		want(t, fmt.Sprintf("long key %d again", i), e.allow(key, l, 1), false, 0)
	}
	if _, err := e.lim.Allow(context.Background(), base+"k", l); err == nil {
		t.Fatalf("a key over MaxKeyLen was accepted")
	}
}
