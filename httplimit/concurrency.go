package httplimit

import (
	"fmt"
	"hash/maphash"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/sluicehq/sluice/internal/decision/ratelimitheaders"
)

// Concurrency caps the requests in flight per key: a request that would
// make more than Max requests of its key run at once is denied at once
// with Config.DenyStatus (429) and a problem+json body
// ([ProblemConcurrency]), or Config.OnDeny, before any limit is decided or
// charged. Its Retry-After is 1 second: a slot frees when a request
// completes, which no limit can foretell.
//
// The count is kept in this process: with several replicas, each admits
// Max per key. A request counts from before its limits are decided
// (shaping included: a request waiting in the queue holds its slot) until
// its handler returns.
//
// A middleware made again for a new configuration (a reload) counts
// afresh unless its Concurrency inherits the old one's counts (Inherit):
// otherwise the requests the old middleware still runs do not count
// against the new one's Max, and each reload lets Max more in flight.
type Concurrency struct {
	// Max is the most requests in flight per key. Required (at least 1).
	Max int

	// Descriptor builds the key from the request, as the descriptors do:
	// requests whose entries have equal values share Max. Empty means the
	// client address (RemoteAddress). A request for which it is absent
	// (a header not sent) is not capped.
	Descriptor Descriptor

	// Inherit, when set, is the Concurrency of a middleware this one
	// replaces, such as the configuration before a reload: the new
	// middleware keeps its counts, so that the requests the old one
	// admitted count against the new Max until they end, and their end
	// is counted where their start was. Each middleware admits a request
	// only while fewer than its own Max of its key are in flight through
	// all that share the counts: a Max lowered admits no one until the
	// count falls below it. The counts are by key: under another
	// Descriptor, the old requests count against the keys their values
	// made. New records a middleware's counts in the
	// Concurrency it was made with (the last one made, when given it
	// twice), for a later one to inherit; it keeps no reference to
	// Inherit. Nil: the counts start at zero.
	Inherit *Concurrency

	counts *concCounts // recorded by New, under countsMu
}

// countsMu guards the counts recorded in every Concurrency: New may be
// called with the same one, or one that inherits it, at once.
var countsMu sync.Mutex

// concurrency is a validated Concurrency: its Max, its key, and the
// in-flight counts per key it shares with the middlewares that inherit
// them.
type concurrency struct {
	max  int32
	ents []entry
	*concCounts
}

// concCounts are in-flight counts per key in shards.
type concCounts struct {
	seed   maphash.Seed
	shards [64]concShard
}

type concShard struct {
	mu sync.Mutex
	// n counts the requests in flight by key. Its keys are copies, made
	// when an entry is created; an entry is only ever changed through
	// its pointer, never assigned again, because assigning a map entry
	// stores the key given, and the keys given may live in a request's
	// pooled storage.
	n map[string]*int32
	_ [40]byte // keep shards on their own cache lines
}

func (m *middleware) newConcurrency(cfg *Concurrency) (*concurrency, error) {
	if cfg.Max < 1 || cfg.Max > 1<<30 {
		return nil, fmt.Errorf("%w: Concurrency.Max %d is not between 1 and %d", ErrConfig, cfg.Max, 1<<30)
	}
	d := cfg.Descriptor
	if len(d) == 0 {
		d = Descriptor{{Source: RemoteAddress()}}
	}
	key, err := compile(0, d)
	if err != nil {
		return nil, fmt.Errorf("concurrency: %w", err)
	}
	for _, e := range key {
		m.needIP = m.needIP || e.needsClient()
	}
	var counts *concCounts
	if cfg.Inherit != nil {
		countsMu.Lock()
		counts = cfg.Inherit.counts
		countsMu.Unlock()
	}
	if counts == nil {
		counts = &concCounts{seed: maphash.MakeSeed()}
		for i := range counts.shards {
			counts.shards[i].n = make(map[string]*int32)
		}
	}
	return &concurrency{max: int32(cfg.Max), ents: key, concCounts: counts}, nil
}

// record keeps the counts of a middleware made in cfg, its Concurrency,
// for a later one to inherit.
func (c *concurrency) record(cfg *Concurrency) {
	countsMu.Lock()
	defer countsMu.Unlock()
	cfg.counts = c.concCounts
}

// key returns the concurrency key of r, with ok false when it is absent.
// The client address alone is its own key; other values are
// length-prefixed into one string.
func (c *concurrency) key(s *scratch, r *http.Request) (key string, ok bool, err error) {
	if len(c.ents) == 1 && c.ents[0].kind == remoteAddress {
		return s.client, true, nil
	}
	b := s.ckey[:0]
	for i := range c.ents {
		v, ok, err := c.ents[i].value(r, s)
		if err != nil {
			return "", false, invalidError{err.Error()}
		}
		if !ok {
			return "", false, nil
		}
		b = strconv.AppendInt(b, int64(len(v)), 10)
		b = append(b, ':')
		b = append(b, v...)
	}
	s.ckey = b
	return string(b), true, nil
}

func (c *concCounts) shard(key string) *concShard {
	return &c.shards[maphash.String(c.seed, key)%uint64(len(c.shards))]
}

// acquire takes a slot of key, reporting false when all are taken.
func (c *concurrency) acquire(key string) bool {
	sh := c.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	n := sh.n[key]
	if n == nil {
		n = new(int32)
		sh.n[strings.Clone(key)] = n
	}
	if *n >= c.max {
		return false
	}
	*n++
	return true
}

// release gives back a slot of key taken by acquire: the count it
// decrements is the one acquire incremented, whatever middleware has
// inherited it since.
func (c *concCounts) release(key string) {
	sh := c.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	n := sh.n[key]
	if n == nil {
		return // cannot happen: released without being acquired
	}
	if *n--; *n <= 0 {
		delete(sh.n, key)
	}
}

// tooConcurrent answers a request over its Concurrency cap.
func (m *middleware) tooConcurrent(w http.ResponseWriter, r *http.Request) {
	m.report(w, r, TooConcurrent)
	if m.headers&ratelimitheaders.HeadersRetryAfter != 0 {
		w.Header()["Retry-After"] = []string{"1"}
	}
	if m.onDeny != nil {
		m.onDeny.ServeHTTP(w, r)
		return
	}
	retry := int64(1)
	writeProblem(w, &problem{
		Type:       ProblemConcurrency,
		Title:      "Too many concurrent requests",
		Status:     m.denyStatus,
		Detail:     "Too many requests of this client are in flight; retry when one completes.",
		RetryAfter: &retry,
	})
}
