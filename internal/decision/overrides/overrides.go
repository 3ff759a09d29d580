// Package overrides holds per-tenant limits set at runtime: a limit
// attached to a domain and a descriptor path whose values are concrete or
// wildcards (tenant=acme, tenant=acme/user=*, api_key=k_*), optionally
// expiring, with a note. A decision consults them through Index.Match (the
// rules.Runtime interface) with the same descriptor entries it matches
// against the rules.
//
// Precedence, for a descriptor of a request:
//
//  1. Envoy's own per-descriptor limit, when the request carries one.
//  2. The most specific override whose path matches the descriptor's
//     entries exactly in number, key for key: every value exact beats
//     any wildcard; among wildcards, position by position from the left,
//     an exact value beats a prefix (k_*), a longer prefix beats a shorter
//     one, and a prefix beats *; expired overrides are ignored.
//  3. The rules file.
//
// This package imports the root package and rules; not a transport or a
// store.
package overrides

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/base/entrytext"
	"github.com/sluicehq/sluice/rules"
)

// MaxPathEntries bounds an override's path.
const MaxPathEntries = 16

// Entry is one key and value pattern of an override's path: an exact
// value, "*" (any value), or a prefix ending in "*" (k_*).
type Entry struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// Override is one runtime limit.
type Override struct {
	Domain string  `json:"domain"`
	Path   []Entry `json:"path"`

	// Limit is the limit, with the keys of a rules file's rate_limit
	// (unit, requests_per_unit, period, algorithm, burst, soft_percent,
	// block_for, unlimited, ...), as JSON; or {"blocked": true}, which
	// denies every request.
	Limit json.RawMessage `json:"limit"`

	Expires *time.Time `json:"expires,omitempty"` // nil: never
	Note    string     `json:"note,omitempty"`

	// Set by the store on every change.
	Updated   time.Time `json:"updated"`
	UpdatedBy string    `json:"updated_by,omitempty"`

	compiled []*sluice.Limit
	unlim    bool
	id       string // ID, fixed by Compile
}

// FieldError is a validation error naming the field at fault.
type FieldError struct {
	Field string
	Msg   string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Msg }

// ParsePath reads a path written as key=value pairs joined by "/", as
// PathString writes it: "tenant=acme/user=*". In a key or a value, "%"
// followed by two hex digits is the byte they spell, so that a "/" in a
// value is written %2F, a "=" in a key %3D and a "%" %25
// ("path=%2Fv1%2Fusers"); a "%" followed by anything else is itself. A
// value may hold "=" as it is (api_key=k_dGVzdA==): a part is cut at
// its first "=".
func ParsePath(s string) ([]Entry, error) {
	if s == "" {
		return nil, &FieldError{"path", "empty"}
	}
	var out []Entry
	for part := range strings.SplitSeq(s, "/") {
		k, v, ok := entrytext.Cut(part)
		if !ok {
			return nil, &FieldError{"path", fmt.Sprintf("%q is not key=value (a / in a value is written %%2F)", part)}
		}
		out = append(out, Entry{Key: k, Value: v})
	}
	return out, nil
}

// PathString writes a path as ParsePath reads it: "%" and "/" escaped in
// keys and values, and "=" in keys, so that two different paths never
// share a string.
func PathString(p []Entry) string {
	return string(appendPath(nil, p))
}

func appendPath(b []byte, p []Entry) []byte {
	for i, e := range p {
		if i > 0 {
			b = append(b, '/')
		}
		b = entrytext.AppendEscaped(b, e.Key, "/=")
		b = append(b, '=')
		b = entrytext.AppendEscaped(b, e.Value, "/")
	}
	return b
}

// ID is the override's identity: its domain ("%" and "|" escaped), "|"
// and its path as PathString writes it (api|tenant=acme/user=*).
// Two overrides share an ID only when they have the same domain and
// path, and putting an override with the ID of another replaces it;
// ParseID reads an ID back. Compile fixes it, so that a compiled override
// gives it without building it (a decision that meets the override
// reports it, and allocates nothing).
func (o *Override) ID() string {
	if o.id != "" {
		return o.id
	}
	b := entrytext.AppendEscaped(nil, o.Domain, "|")
	b = append(b, '|')
	return string(appendPath(b, o.Path))
}

// ParseID reads an ID back into its domain and path.
func ParseID(id string) (domain string, path []Entry, err error) {
	d, p, ok := strings.Cut(id, "|")
	if !ok {
		return "", nil, &FieldError{"id", fmt.Sprintf("%q is not domain|path", id)}
	}
	path, err = ParsePath(p)
	return entrytext.Unescape(d), path, err
}

// legacyID is the ID that versions before escaping gave o: the domain,
// "|" and the path's keys and values as they are. Two paths could share
// it ([user="q/team=c"] and [user=q, team=c]); a RedisStore still reads
// an override stored under it (see RedisStore).
func legacyID(o *Override) string {
	var b strings.Builder
	b.WriteString(o.Domain)
	b.WriteByte('|')
	for i, e := range o.Path {
		if i > 0 {
			b.WriteByte('/')
		}
		b.WriteString(e.Key)
		b.WriteByte('=')
		b.WriteString(e.Value)
	}
	return b.String()
}

// Compile validates o and compiles its limit. Each error names its field.
// A limit is what a rules file's rate_limit takes, less what the rules
// checker (sluice check) only warns of there, for Envoy's sake: a limit
// without requests_per_unit (0: every request denied; an override says
// {"blocked": true}), or a setting that has no effect.
func (o *Override) Compile() error { return o.compile(true) }

// compile is Compile; not strict, it takes a limit the rules checker
// warns of, as versions before refused none: what a store kept loads as
// it was put.
func (o *Override) compile(strict bool) error {
	var errs []error
	if o.Domain == "" {
		errs = append(errs, &FieldError{"domain", "empty"})
	} else if len(o.Domain) > rules.MaxEntryLen {
		errs = append(errs, &FieldError{"domain", fmt.Sprintf("%d bytes, at most %d", len(o.Domain), rules.MaxEntryLen)})
	}
	switch {
	case len(o.Path) == 0:
		errs = append(errs, &FieldError{"path", "empty: an override names at least one descriptor entry"})
	case len(o.Path) > MaxPathEntries:
		errs = append(errs, &FieldError{"path", fmt.Sprintf("%d entries, at most %d", len(o.Path), MaxPathEntries)})
	}
	for i, e := range o.Path {
		f := "path[" + strconv.Itoa(i) + "]"
		switch {
		case e.Key == "":
			errs = append(errs, &FieldError{f + ".key", "empty"})
		case len(e.Key) > rules.MaxEntryLen || len(e.Value) > rules.MaxEntryLen:
			errs = append(errs, &FieldError{f, fmt.Sprintf("key or value over %d bytes", rules.MaxEntryLen)})
		case strings.Contains(strings.TrimSuffix(e.Value, "*"), "*"):
			errs = append(errs, &FieldError{f + ".value", fmt.Sprintf("%q: a wildcard is * alone or at the end of a prefix (k_*)", e.Value)})
		}
	}
	if o.Note != "" && len(o.Note) > 4096 {
		errs = append(errs, &FieldError{"note", "over 4096 bytes"})
	}
	limits, unlim, warns, err := compileLimit(o.Limit)
	if err != nil {
		errs = append(errs, err)
	}
	if strict {
		for _, w := range warns {
			errs = append(errs, &FieldError{"limit", w})
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	o.compiled, o.unlim, o.id = limits, unlim, ""
	o.id = o.ID()
	return nil
}

// compileLimit compiles a limit's JSON with the rules' own compiler, so
// that an override takes exactly what a rules file takes, and returns
// what the rules checker warns of.
func compileLimit(raw json.RawMessage) ([]*sluice.Limit, bool, []string, error) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil, false, nil, &FieldError{"limit", `missing: a limit such as {"unit": "minute", "requests_per_unit": 100}`}
	}
	var probe map[string]json.RawMessage
	if err := json.Unmarshal(raw, &probe); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return nil, false, nil, &FieldError{"limit", fmt.Sprintf(`a JSON %s where an object is expected, such as {"unit": "minute", "requests_per_unit": 100}`, te.Value)}
		}
		return nil, false, nil, &FieldError{"limit", "not JSON: " + err.Error()}
	}
	if _, ok := probe["calendar"]; ok {
		return nil, false, nil, &FieldError{"limit.calendar", "calendar periods are set in the rules file: an override's limit counts in fixed units, as Envoy's"}
	}
	if b, ok := probe["blocked"]; ok {
		if string(b) != "true" || len(probe) != 1 {
			return nil, false, nil, &FieldError{"limit.blocked", `"blocked" is true and alone`}
		}
		// A block is a limit of zero an hour: a client is told to come
		// back in an hour (the period of a limit nothing can pass), not
		// every second.
		raw = json.RawMessage(`{"unit": "hour", "requests_per_unit": 0}`)
	}
	var flat bytes.Buffer
	if err := json.Compact(&flat, raw); err != nil {
		return nil, false, nil, &FieldError{"limit", err.Error()}
	}
	key := flat.String()
	if v, ok := compiledLimits.Load(key); ok {
		c := v.(compiledLimit)
		return c.limits, c.unlimited, c.warnings, nil
	}
	src := "domain: override\ndescriptors:\n  - key: k\n    rate_limit: " + key + "\n"
	d, err := rules.Parse("limit", []byte(src))
	if err != nil {
		var re *rules.Error
		if errors.As(err, &re) && len(re.Problems) > 0 {
			msgs := make([]string, len(re.Problems))
			for i, p := range re.Problems {
				msgs[i] = p.Msg
			}
			return nil, false, nil, &FieldError{"limit", strings.Join(msgs, "; ")}
		}
		return nil, false, nil, &FieldError{"limit", err.Error()}
	}
	var warns []string
	for _, w := range d.Warnings {
		msg := w.Msg
		if strings.HasPrefix(msg, "requests_per_unit is missing") {
			msg = `requests_per_unit is missing: say how many requests each unit allows ({"blocked": true} denies every request)`
		}
		warns = append(warns, msg)
	}
	r := d.Rules[0]
	if compiledCount.Add(1) <= maxCompiled {
		compiledLimits.Store(key, compiledLimit{r.Limits, r.Unlimited, warns})
	}
	return r.Limits, r.Unlimited, warns, nil
}

// compiledLimits caches compiled limits by their compact JSON: overrides
// by the million share a few limits (a plan's), and sharing the compiled
// limit is also what lets them share its memory. Limits are immutable.
var (
	compiledLimits sync.Map // string -> compiledLimit
	compiledCount  atomic.Int64
)

const maxCompiled = 10_000

type compiledLimit struct {
	limits    []*sluice.Limit
	unlimited bool
	warnings  []string // what the rules checker warns of
}

// Limits returns the compiled limits (nil before Compile, or when
// unlimited) and whether the override is unlimited.
func (o *Override) Limits() ([]*sluice.Limit, bool) { return o.compiled, o.unlim }

// expired reports whether o is expired at now.
func (o *Override) expired(now time.Time) bool {
	return o.Expires != nil && !now.Before(*o.Expires)
}

// specificity orders the patterns of one depth: every value exact first;
// then position by position, exact, then longer prefixes, then *.
func compareSpecificity(a, b []Entry) int {
	for i := range a {
		ra, rb := rank(a[i].Value), rank(b[i].Value)
		if ra != rb {
			return rb - ra // higher rank first
		}
	}
	return 0
}

// rank is an entry value's specificity: exact values above every prefix,
// longer prefixes above shorter ones, * at 0.
func rank(v string) int {
	switch {
	case v == "*":
		return 0
	case strings.HasSuffix(v, "*"):
		return len(v) // 1..: a prefix of len(v)-1 bytes
	}
	return 1 << 30
}

// exact reports whether every value of p is exact.
func exact(p []Entry) bool {
	for _, e := range p {
		if strings.HasSuffix(e.Value, "*") {
			return false
		}
	}
	return true
}

// asEntries is p as request entries (the index's keys of exact paths).
func asEntries(p []Entry) []rules.Entry {
	out := make([]rules.Entry, len(p))
	for i, e := range p {
		out[i] = rules.Entry{Key: e.Key, Value: e.Value}
	}
	return out
}

// matches reports whether pattern p matches entries (same length).
func matches(p []Entry, entries []rules.Entry) bool {
	for i, e := range p {
		if e.Key != entries[i].Key {
			return false
		}
		switch {
		case e.Value == "*":
		case strings.HasSuffix(e.Value, "*"):
			if !strings.HasPrefix(entries[i].Value, e.Value[:len(e.Value)-1]) {
				return false
			}
		default:
			if e.Value != entries[i].Value {
				return false
			}
		}
	}
	return true
}

// Index holds the overrides in force for lookups: the exact ones in
// sharded maps (one lookup, no allocation), the wildcard ones by domain and
// depth, most specific first. It is safe for concurrent use; it
// implements rules.Runtime.
type Index struct {
	seed   maphash.Seed
	shards [numShards]indexShard
	now    func() time.Time

	// The wildcard overrides, few: copied on every change, read without
	// a lock.
	wmu  sync.Mutex
	wild atomic.Pointer[map[wildKey][]*Override]

	// exactN counts the all-exact overrides: with none (the common case
	// of a node that has no overrides), a lookup builds no key.
	exactN atomic.Int64

	// gen counts the changes (Generation).
	gen atomic.Uint64
}

const numShards = 64

type indexShard struct {
	mu sync.RWMutex
	m  map[string]*Override
}

type wildKey struct {
	domain string
	depth  int
}

// NewIndex returns an empty index; now is its clock for expiry (time.Now
// when nil).
func NewIndex(now func() time.Time) *Index {
	if now == nil {
		now = time.Now
	}
	x := &Index{seed: maphash.MakeSeed(), now: now}
	x.wild.Store(&map[wildKey][]*Override{})
	for i := range x.shards {
		x.shards[i].m = map[string]*Override{}
	}
	return x
}

// appendEntryKey appends the exact key of a domain and entries: the
// index's key of an all-exact override, and what a request looks up.
func appendEntryKey(b []byte, domain string, entries []rules.Entry) []byte {
	b = entrytext.AppendField(b, domain)
	for _, e := range entries {
		b = entrytext.AppendField(entrytext.AppendField(b, e.Key), e.Value)
	}
	return b
}

func (x *Index) shard(key []byte) *indexShard {
	return &x.shards[maphash.Bytes(x.seed, key)%numShards]
}

// Generation counts the changes made to the index (Put, Delete): who
// keeps what a match gave, such as the Rate Limit Quota Service's
// buckets, matches again when it moves. An override that expires stops
// matching at once, but moves it only when it is removed (sluice serve
// removes expired overrides every second).
func (x *Index) Generation() uint64 { return x.gen.Load() }

// Put adds or replaces o (compiled) in the index.
func (x *Index) Put(o *Override) {
	defer x.gen.Add(1)
	x.remove(o)
	if exact(o.Path) {
		key := appendEntryKey(nil, o.Domain, asEntries(o.Path))
		sh := x.shard(key)
		sh.mu.Lock()
		sh.m[string(key)] = o
		sh.mu.Unlock()
		x.exactN.Add(1)
		return
	}
	wk := wildKey{o.Domain, len(o.Path)}
	x.wmu.Lock()
	defer x.wmu.Unlock()
	m := maps.Clone(*x.wild.Load())
	list := append(slices.Clone(m[wk]), o)
	slices.SortStableFunc(list, func(a, b *Override) int { return compareSpecificity(a.Path, b.Path) })
	m[wk] = list
	x.wild.Store(&m)
}

// Delete removes the override of domain and path, if any.
func (x *Index) Delete(domain string, path []Entry) {
	x.remove(&Override{Domain: domain, Path: path})
	x.gen.Add(1)
}

func (x *Index) remove(o *Override) {
	if exact(o.Path) {
		key := appendEntryKey(nil, o.Domain, asEntries(o.Path))
		sh := x.shard(key)
		sh.mu.Lock()
		if _, ok := sh.m[string(key)]; ok {
			delete(sh.m, string(key))
			x.exactN.Add(-1)
		}
		sh.mu.Unlock()
		return
	}
	wk := wildKey{o.Domain, len(o.Path)}
	x.wmu.Lock()
	defer x.wmu.Unlock()
	list := (*x.wild.Load())[wk]
	if i := slices.IndexFunc(list, func(w *Override) bool { return slices.Equal(w.Path, o.Path) }); i >= 0 {
		m := maps.Clone(*x.wild.Load())
		if list = slices.Delete(slices.Clone(list), i, i+1); len(list) == 0 {
			delete(m, wk)
		} else {
			m[wk] = list
		}
		x.wild.Store(&m)
	}
}

// Lookup returns the override in force for a descriptor of domain with
// entries (nil when none): the most specific one, expired ones skipped.
func (x *Index) Lookup(domain string, entries []rules.Entry) *Override {
	if x.exactN.Load() > 0 {
		var stack [256]byte
		key := appendEntryKey(stack[:0], domain, entries)
		sh := x.shard(key)
		sh.mu.RLock()
		o := sh.m[string(key)]
		sh.mu.RUnlock()
		if o != nil && (o.Expires == nil || !o.expired(x.now())) {
			return o
		}
	}
	for _, w := range (*x.wild.Load())[wildKey{domain, len(entries)}] {
		if matches(w.Path, entries) && (w.Expires == nil || !w.expired(x.now())) {
			return w
		}
	}
	return nil
}

// Match implements rules.Runtime.
func (x *Index) Match(domain string, entries []rules.Entry) (rules.RuntimeMatch, bool) {
	o := x.Lookup(domain, entries)
	if o == nil {
		return rules.RuntimeMatch{}, false
	}
	return rules.RuntimeMatch{Limits: o.compiled, Unlimited: o.unlim, ID: o.ID()}, true
}

var timeZero time.Time

// liveSet is the overrides a store holds, by ID, under its lock.
type liveSet struct {
	mu   sync.Mutex
	live map[string]*Override
}

// List returns every override, sorted by ID.
func (l *liveSet) List() []*Override {
	l.mu.Lock()
	out := make([]*Override, 0, len(l.live))
	for _, o := range l.live {
		out = append(out, o)
	}
	l.mu.Unlock()
	slices.SortFunc(out, func(a, b *Override) int { return strings.Compare(a.ID(), b.ID()) })
	return out
}

// Get returns the override of domain and path.
func (l *liveSet) Get(domain string, path []Entry) (*Override, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	o, ok := l.live[(&Override{Domain: domain, Path: path}).ID()]
	return o, ok
}
