package decide

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/testsupport/rulestest"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/rules"
)

// TestPermitTokenFormat: the token of the permits Acquire makes parses
// back to them (so Acquire's IDs are what the format expects), with the
// tag of each key and where they are held; anything else is refused.
func TestPermitTokenFormat(t *testing.T) {
	store := memstore.New(memstore.Config{SweepInterval: -1})
	defer store.Close()
	l := &sluice.Limit{Algorithm: sluice.Concurrency, Rate: 3, Period: 60e9}
	rate := &sluice.Limit{Algorithm: sluice.FixedWindow, Rate: 3, Period: 60e9}
	hits := []sluice.Hit{{Key: "a", Limit: l, Cost: 1}, {Key: "r", Limit: rate, Cost: 1}, {Key: "b", Limit: l, Cost: 1}, {Key: "c", Limit: l}}
	p, d, err := sluice.NewLimiter(store).Acquire(context.Background(), hits, nil)
	if err != nil || !d.Allowed || p == nil {
		t.Fatalf("Acquire: %v %+v", err, d)
	}
	for _, nodes := range []int64{0, 1, 7, maxNodes} {
		tok := permitToken(hits, hits, nodes)
		v, ok := parseToken(tok)
		if !ok || v.nodes != nodes || len(v.items) != 2*itemLen {
			t.Fatalf("nodes %d: %q parses to %+v, %v", nodes, tok, v, ok)
		}
		for i, h := range []sluice.Hit{hits[0], hits[2]} {
			item := v.items[i*itemLen : (i+1)*itemLen]
			if item[:tagLen] != string(appendTag(nil, h.Key)) || item[tagLen:] != h.Permit {
				t.Errorf("item %d %q: want the tag of %q and ID %q", i, item, h.Key, h.Permit)
			}
		}
	}
	if got := string(appendTag(nil, "")); got != "811c9dc5" {
		t.Errorf("the tag of the empty key is %s, want FNV-1a's offset basis 811c9dc5", got)
	}
	item := strings.Repeat("0", tagLen) + strings.Repeat("A", idLen)
	full := "l1048576." + strings.Repeat(item, sluice.MaxHits)
	if len(full) != maxToken {
		t.Fatalf("the longest token is %d bytes, maxToken %d", len(full), maxToken)
	}
	for tok, want := range map[string]bool{
		"s" + item:                     true,
		full:                           true,
		"l1048577." + item:             false, // more nodes than any share
		"l10485760." + item:            false,
		"s" + strings.Repeat(item, 65): false, // more permits than a request holds
		"s" + item[:itemLen-1]:         false,
		"s" + item + "A":               false,
		"s" + strings.ToUpper("abcdef00") + item[tagLen:]:  false,
		"s" + item[:tagLen] + "AAAAAAAAAAAAAAAAAAAAAAAAA1": false, // 1 is not base32
		"s" + item[:tagLen] + "AAAAAAAAAAAAAAAAAAAAAAAAAa": false,
		"l." + item:   false,
		"l01." + item: false,
		"l-1." + item: false,
		"l+1." + item: false,
		"l1" + item:   false,
		"S" + item:    false,
		"":            false,
		"s":           false,
	} {
		if _, ok := parseToken(tok); ok != want {
			t.Errorf("parseToken(%.40q…): %v, want %v", tok, ok, want)
		}
	}
}

// FuzzParseToken: whatever a client sends, parsing ends, and what it
// accepts is within the bounds a release relies on.
func FuzzParseToken(f *testing.F) {
	item := "0123abcd" + strings.Repeat("Z", idLen)
	for _, s := range []string{"s" + item, "l3." + item + item, "l1048576." + item, "s", "l.", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, ok := parseToken(s)
		if !ok {
			return
		}
		if len(s) > maxToken || v.nodes < 0 || v.nodes > maxNodes || len(v.items) == 0 || len(v.items)%itemLen != 0 || len(v.items)/itemLen > sluice.MaxHits {
			t.Fatalf("%q accepted as %+v", s, v)
		}
	})
}

// countStore is a memstore that records the most permits one release
// asked for.
type countStore struct {
	*memstore.Store
	most atomic.Int64
}

func (s *countStore) Permits(ctx context.Context, hits []sluice.Hit, out []sluice.Decision, release bool) error {
	if release && int64(len(hits)) > s.most.Load() {
		s.most.Store(int64(len(hits)))
	}
	return s.Store.Permits(ctx, hits, out, release)
}

// TestReleaseBound: a hostile request of many release descriptors, each
// with a token of 64 items carrying its key's tag, asks the store to
// release at most sluice.MaxHits permits, in one call.
func TestReleaseBound(t *testing.T) {
	store := &countStore{Store: memstore.New(memstore.Config{SweepInterval: -1})}
	defer store.Close()
	cfg := rulestest.Config(t, "domain: api\ndescriptors:\n  - key: k\n    concurrency: {max: 2}\n")
	d, err := New(Config{Limiter: sluice.NewLimiter(store), Rules: cfg})
	if err != nil {
		t.Fatal(err)
	}
	var r Request
	r.Domain = "api"
	for v := range 60 {
		desc := rules.Descriptor{Entries: []rules.Entry{{Key: "k", Value: string(rune('a'+v%26)) + string(rune('a'+v/26))}}, Cost: 1}
		var p rules.Plan
		if err := cfg.Plan("api", []rules.Descriptor{desc}, &p); err != nil {
			t.Fatal(err)
		}
		tag := string(appendTag(nil, p.Hits[0].Key))
		var b strings.Builder
		b.WriteString("s")
		for i := range sluice.MaxHits {
			b.WriteString(tag)
			b.WriteString(strings.Repeat("A", idLen-2))
			b.WriteByte(byte('A' + i/26))
			b.WriteByte(byte('A' + i%26))
		}
		r.Descriptors = append(r.Descriptors, desc)
		r.Release = append(r.Release, b.String())
	}
	var o Outcome
	if err := d.Decide(context.Background(), &r, &o); err != nil {
		t.Fatal(err)
	}
	if o.ReleaseStale != 60 || o.Released != 0 || !o.Overall.Allowed {
		t.Fatalf("released %d, stale %d (none of the permits was held), %+v", o.Released, o.ReleaseStale, o.Overall)
	}
	if got := store.most.Load(); got != sluice.MaxHits {
		t.Fatalf("one release asked for %d permits, want at most (and here) %d", got, sluice.MaxHits)
	}
}
