package overrides_test

import (
	"context"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice/internal/decision/overrides"
	"github.com/sluicehq/sluice/rules"
)

// The overrides of the legacy tests, as JSON: two whose legacy IDs (the
// domain and path unescaped) are one, "api|user=q/team=c", a value with
// "/" and "=", and a plain one.
const (
	legacyA     = `{"domain":"api","path":[{"key":"user","value":"q/team=c"}],"limit":{"unit":"hour","requests_per_unit":7},"updated":"2026-11-01T00:00:00Z","updated_by":"ops"}`
	legacyB     = `{"domain":"api","path":[{"key":"user","value":"q"},{"key":"team","value":"c"}],"limit":{"unit":"hour","requests_per_unit":9},"updated":"2026-11-01T00:01:00Z","updated_by":"ops"}`
	legacyK     = `{"domain":"api","path":[{"key":"api_key","value":"k/abc=="}],"limit":{"blocked":true},"updated":"2026-11-01T00:03:00Z","updated_by":"ops"}`
	legacyPlain = `{"domain":"api","path":[{"key":"tenant","value":"acme"}],"limit":{"unit":"hour","requests_per_unit":5},"updated":"2026-11-01T00:04:00Z","updated_by":"ops"}`
)

// listed returns the IDs a backend lists, each with its limit; an ID
// listed twice is listed as "twice".
func listed(b overrides.Backend) map[string]string {
	out := map[string]string{}
	for _, o := range b.List() {
		if _, dup := out[o.ID()]; dup {
			out[o.ID()] = "twice"
			continue
		}
		out[o.ID()] = string(o.Limit)
	}
	return out
}

// limitAt returns the limit an index enforces for a descriptor ("" when
// no override applies).
func limitAt(idx *overrides.Index, domain string, kv ...string) string {
	var p []overrides.Entry
	for i := 0; i+1 < len(kv); i += 2 {
		p = append(p, overrides.Entry{Key: kv[i], Value: kv[i+1]})
	}
	o := idx.Lookup(domain, asRulesEntries(p))
	if o == nil {
		return ""
	}
	return string(o.Limit)
}

// TestFileStoreLegacy: a file written by a version whose IDs were not
// escaped, in which [user=q, team=c] replaced [user="q/team=c"] (one
// legacy ID) and was then deleted, leaving the first enforced but not
// listed. Opened now, every override it enforced is listed once under
// its ID, enforced, and deleted through the store; a reopen agrees.
func TestFileStoreLegacy(t *testing.T) {
	file := filepath.Join(t.TempDir(), "overrides.jsonl")
	lines := []string{
		`{"op":"put","at":"2026-11-01T00:00:00Z","by":"ops","after":` + legacyA + `}`,
		`{"op":"put","at":"2026-11-01T00:01:00Z","by":"ops","before":` + legacyA + `,"after":` + legacyB + `}`,
		`{"op":"delete","at":"2026-11-01T00:02:00Z","by":"ops","before":` + legacyB + `}`,
		`{"op":"put","at":"2026-11-01T00:03:00Z","by":"ops","after":` + legacyK + `}`,
		`{"op":"put","at":"2026-11-01T00:04:00Z","by":"ops","after":` + legacyPlain + `}`,
		// A limit that Put now refuses (no requests_per_unit: 0, every
		// request denied) loads as it was put.
		`{"op":"put","at":"2026-11-01T00:05:00Z","by":"ops","after":{"domain":"api","path":[{"key":"tenant","value":"zero"}],"limit":{"unit":"minute"}}}`,
	}
	if err := os.WriteFile(file, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	idx := overrides.NewIndex(nil)
	s, err := overrides.OpenFile(file, idx, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"api|user=q%2Fteam=c":   `{"unit":"hour","requests_per_unit":7}`,
		"api|api_key=k%2Fabc==": `{"blocked":true}`,
		"api|tenant=acme":       `{"unit":"hour","requests_per_unit":5}`,
		"api|tenant=zero":       `{"unit":"minute"}`,
	}
	if got := listed(s); !maps.Equal(got, want) {
		t.Fatalf("listed %v, want %v", got, want)
	}
	if got := limitAt(idx, "api", "user", "q/team=c"); got != want["api|user=q%2Fteam=c"] {
		t.Errorf(`user="q/team=c": limit %q`, got)
	}
	if got := limitAt(idx, "api", "user", "q", "team", "c"); got != "" {
		t.Errorf("user=q, team=c: limit %q after its delete", got)
	}
	for _, path := range []string{"user=q%2Fteam=c", "api_key=k%2Fabc=="} {
		p, _ := overrides.ParsePath(path)
		if _, ok := s.Get("api", p); !ok {
			t.Errorf("Get %s: none", path)
		}
		if c, err := s.Delete("api", p, "test"); err != nil || c == nil {
			t.Errorf("Delete %s: %v, %v", path, c, err)
		}
	}
	s.Close()
	idx = overrides.NewIndex(nil)
	s, err = overrides.OpenFile(file, idx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got := listed(s); len(got) != 2 || got["api|tenant=acme"] == "" || got["api|tenant=zero"] == "" {
		t.Errorf("reopened after the deletes: listed %v, want api|tenant=acme and api|tenant=zero", got)
	}
	if got := limitAt(idx, "api", "tenant", "zero"); got != `{"unit":"minute"}` {
		t.Errorf("tenant=zero: limit %q, want the one it was put with", got)
	}
	if got := limitAt(idx, "api", "user", "q/team=c"); got != "" {
		t.Errorf(`reopened after the deletes: user="q/team=c" still limited by %q`, got)
	}
}

// oldChangeLua is the change script of the version whose IDs were not
// escaped: what an older node runs on the same Redis during a rolling
// upgrade. KEYS: the hash, the version. ARGV: id, JSON, channel, op,
// expected JSON.
const oldChangeLua = `
local before = redis.call('HGET', KEYS[1], ARGV[1])
if ARGV[5] ~= '' and before ~= ARGV[5] then return {-1, ''} end
if ARGV[4] == 'put' then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
else
  if not before then return {0, ''} end
  redis.call('HDEL', KEYS[1], ARGV[1])
end
local v = redis.call('INCR', KEYS[2])
redis.call('PUBLISH', ARGV[3], v .. '\n' .. ARGV[4] .. '\n' .. ARGV[1] .. '\n' .. ARGV[2])
return {v, before or ''}
`

// TestRedisStoreLegacy: a real Redis hash written by a version whose IDs
// were not escaped, read by two nodes of this one: every override is
// listed once under its ID and enforced; a put of [user=q, team=c], whose
// ID is the legacy field of [user="q/team=c"], moves that one under its
// own ID instead of replacing it; a delete removes a legacy field; an
// older node's put (its script, its message) is applied; one override
// under both its ID and its legacy field is listed once, the one updated
// last in force, and one delete removes both.
func TestRedisStoreLegacy(t *testing.T) {
	c, prefix := newRedis(t)
	hash, vkey, ch := prefix+"{overrides}", prefix+"{overrides}:version", prefix+"overrides:changes"
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	do := func(cmd rueidis.Completed) {
		t.Helper()
		if err := c.Do(ctx, cmd).Error(); err != nil {
			t.Fatal(err)
		}
	}
	// The hash as the older version left it: [user=q, team=c] was put
	// after [user="q/team=c"] and replaced it; then [user="q/team=c"]
	// was put again. Three changes. (And a limit that Put now refuses,
	// which loads as it was put.)
	do(c.B().Hset().Key(hash).FieldValue().FieldValue("api|user=q/team=c", legacyA).FieldValue("api|api_key=k/abc==", legacyK).FieldValue("api|tenant=acme", legacyPlain).
		FieldValue("api|tenant=zero", `{"domain":"api","path":[{"key":"tenant","value":"zero"}],"limit":{"unit":"minute"}}`).Build())
	do(c.B().Set().Key(vkey).Value("3").Build())

	var stores []*overrides.RedisStore
	var idxs []*overrides.Index
	for range 2 {
		idx := overrides.NewIndex(nil)
		s := overrides.NewRedisStore(func() (rueidis.Client, error) { return c, nil }, prefix, idx, nil, nil)
		go s.Run(ctx)
		stores, idxs = append(stores, s), append(idxs, idx)
	}
	// both waits until both nodes list want (a change reaches the other
	// node within a second; this asserts that it arrives, not how fast).
	both := func(what string, want map[string]string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			a, b := listed(stores[0]), listed(stores[1])
			if maps.Equal(a, want) && maps.Equal(b, want) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: the nodes list\n%v\n%v\nwant %v", what, a, b, want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	fields := func() []string {
		t.Helper()
		m, err := c.Do(ctx, c.B().Hkeys().Key(hash).Build()).AsStrSlice()
		if err != nil {
			t.Fatal(err)
		}
		slices.Sort(m)
		return m
	}
	lim7, lim9, blocked, lim5 := `{"unit":"hour","requests_per_unit":7}`, `{"unit":"hour","requests_per_unit":9}`, `{"blocked":true}`, `{"unit":"hour","requests_per_unit":5}`
	want := map[string]string{"api|user=q%2Fteam=c": lim7, "api|api_key=k%2Fabc==": blocked, "api|tenant=acme": lim5, "api|tenant=zero": `{"unit":"minute"}`}
	both("the legacy hash", want)
	for i, idx := range idxs {
		if got := limitAt(idx, "api", "user", "q/team=c"); got != lim7 {
			t.Errorf(`node %d: user="q/team=c" limited by %q, want %s`, i, got, lim7)
		}
		if got := limitAt(idx, "api", "api_key", "k/abc=="); got != blocked {
			t.Errorf(`node %d: api_key="k/abc==" limited by %q, want %s`, i, got, blocked)
		}
	}

	// [user=q, team=c]: its ID is the legacy field of [user="q/team=c"].
	b := mustDecode(t, legacyB)
	ch0, err := stores[0].Put(b, "test")
	if err != nil || ch0.Before != nil {
		t.Fatalf("put user=q, team=c: %+v, %v; want a change without before", ch0, err)
	}
	want["api|user=q/team=c"] = lim9
	both("after the put of user=q, team=c", want)
	if got, wantFields := fields(), []string{"api|api_key=k/abc==", "api|tenant=acme", "api|tenant=zero", "api|user=q%2Fteam=c", "api|user=q/team=c"}; !slices.Equal(got, wantFields) {
		t.Errorf("hash fields %q, want %q", got, wantFields)
	}
	for i, idx := range idxs {
		if a, b := limitAt(idx, "api", "user", "q/team=c"), limitAt(idx, "api", "user", "q", "team", "c"); a != lim7 || b != lim9 {
			t.Errorf(`node %d: user="q/team=c" limited by %q, user=q, team=c by %q`, i, a, b)
		}
	}

	// A delete of an override under its legacy field.
	k, _ := overrides.ParsePath("api_key=k%2Fabc==")
	if ch, err := stores[1].Delete("api", k, "test"); err != nil || ch == nil || ch.Before == nil || string(ch.Before.Limit) != blocked {
		t.Fatalf("delete api_key=k%%2Fabc==: %+v, %v", ch, err)
	}
	delete(want, "api|api_key=k%2Fabc==")
	both("after the delete of a legacy field", want)
	if slices.Contains(fields(), "api|api_key=k/abc==") {
		t.Error("the legacy field is still in the hash")
	}

	// An older node puts an override: under its legacy field, with the
	// older script and message.
	old := rueidis.NewLuaScript(oldChangeLua)
	oldPut := func(field, raw string) {
		t.Helper()
		if err := old.Exec(ctx, c, []string{hash, vkey}, []string{field, raw, ch, "put", ""}).Error(); err != nil {
			t.Fatal(err)
		}
	}
	x1 := `{"domain":"api","path":[{"key":"path","value":"/v1/x"}],"limit":{"unit":"hour","requests_per_unit":1},"updated":"2026-11-02T00:00:00Z"}`
	oldPut("api|path=/v1/x", x1)
	want["api|path=%2Fv1%2Fx"] = `{"unit":"hour","requests_per_unit":1}`
	both("after an older node's put", want)

	// This version puts it again; the older node then puts it once more,
	// later: one override under both fields, the older node's in force.
	x := mustDecode(t, x1)
	x.Limit = json.RawMessage(`{"unit":"hour","requests_per_unit":2}`)
	if _, err := stores[0].Put(x, "test"); err != nil {
		t.Fatal(err)
	}
	want["api|path=%2Fv1%2Fx"] = `{"unit":"hour","requests_per_unit":2}`
	both("after this version's put of it", want)
	if slices.Contains(fields(), "api|path=/v1/x") {
		t.Error("a put left the override's legacy field in the hash")
	}
	later := time.Now().Add(time.Hour).UTC().Format(time.RFC3339Nano)
	oldPut("api|path=/v1/x", `{"domain":"api","path":[{"key":"path","value":"/v1/x"}],"limit":{"unit":"hour","requests_per_unit":3},"updated":"`+later+`"}`)
	want["api|path=%2Fv1%2Fx"] = `{"unit":"hour","requests_per_unit":3}`
	both("under both fields, the older node's put updated last", want)
	for i, idx := range idxs {
		if got := limitAt(idx, "api", "path", "/v1/x"); got != want["api|path=%2Fv1%2Fx"] {
			t.Errorf("node %d: path=/v1/x limited by %q", i, got)
		}
	}
	p, _ := overrides.ParsePath("path=%2Fv1%2Fx")
	if ch, err := stores[1].Delete("api", p, "test"); err != nil || ch == nil || string(ch.Before.Limit) != want["api|path=%2Fv1%2Fx"] {
		t.Fatalf("delete path=%%2Fv1%%2Fx: %+v, %v", ch, err)
	}
	delete(want, "api|path=%2Fv1%2Fx")
	both("after one delete of the override under both fields", want)
	for _, f := range fields() {
		if strings.HasPrefix(f, "api|path=") {
			t.Errorf("field %q left after the delete", f)
		}
	}
	for i, idx := range idxs {
		if got := limitAt(idx, "api", "path", "/v1/x"); got != "" {
			t.Errorf("node %d: path=/v1/x still limited by %q", i, got)
		}
	}
}

func mustDecode(t *testing.T, raw string) *overrides.Override {
	t.Helper()
	var o overrides.Override
	if err := json.Unmarshal([]byte(raw), &o); err != nil {
		t.Fatal(err)
	}
	return &o
}

func asRulesEntries(p []overrides.Entry) []rules.Entry {
	out := make([]rules.Entry, len(p))
	for i, e := range p {
		out[i] = rules.Entry{Key: e.Key, Value: e.Value}
	}
	return out
}
