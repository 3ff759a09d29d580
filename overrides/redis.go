package overrides

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/rueidis"
)

// changeLua applies one change to the overrides hash, bumps the version
// and publishes the change, atomically. KEYS: the hash, the version.
// ARGV: id, the override's JSON (put), the channel, op (put or delete),
// and for a conditional delete (expiry) the JSON the override must still
// have. Returns {version, before}: version 0 when a delete found nothing,
// -1 when a conditional delete found the override changed.
const changeLua = `
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

var changeScript = rueidis.NewLuaScript(changeLua)

// RedisStore keeps overrides in Redis, shared by every node on it: one
// hash of every override, a version bumped by every change, and a
// channel every change is published on, all written by one script. Each
// node keeps a copy in its Index: it applies the published changes in
// version order, and reads the whole hash again when it finds a gap
// (a message lost while its subscription was down), when it
// (re)subscribes, and when a poll of the version (every PollInterval)
// finds it ahead. So a change reaches every node within the publish
// latency, and within PollInterval after a lost message.
type RedisStore struct {
	client func() (rueidis.Client, error)
	hash   string
	vkey   string
	ch     string
	idx    *Index
	now    func() time.Time
	log    *slog.Logger

	liveSet
	raw     map[string]string // by ID: the JSON in Redis
	version int64             // the last change applied
	synced  bool
}

// PollInterval is how often a RedisStore reads the version, to catch up
// with changes whose messages it lost.
const PollInterval = 500 * time.Millisecond

// NewRedisStore returns a store in the Redis that client gives, under
// keys starting with prefix; Run keeps idx in step with it.
func NewRedisStore(client func() (rueidis.Client, error), prefix string, idx *Index, now func() time.Time, log *slog.Logger) *RedisStore {
	if now == nil {
		now = time.Now
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	// One hash tag: the script's two keys in one Cluster slot.
	return &RedisStore{client: client, hash: prefix + "{overrides}", vkey: prefix + "{overrides}:version", ch: prefix + "overrides:changes",
		idx: idx, now: now, log: log, liveSet: liveSet{live: map[string]*Override{}}, raw: map[string]string{}}
}

// Run keeps the index in step with Redis until ctx ends: the
// subscription, the poll and the sweep of expired overrides.
func (s *RedisStore) Run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Go(func() { s.subscribe(ctx) })
	wg.Go(func() {
		t := time.NewTicker(PollInterval)
		defer t.Stop()
		sweep := time.Now()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			s.poll(ctx)
			if time.Since(sweep) >= time.Second {
				sweep = time.Now()
				if _, err := s.Sweep(ctx); err != nil && ctx.Err() == nil {
					s.log.Warn("overrides: expired ones not removed", "err", err)
				}
			}
		}
	})
	wg.Wait()
}

// subscribe receives the changes, reading the hash again before each
// (re)subscription.
func (s *RedisStore) subscribe(ctx context.Context) {
	for ctx.Err() == nil {
		c, err := s.client()
		if err == nil {
			err = s.resync(ctx)
		}
		if err == nil {
			err = c.Receive(ctx, c.B().Subscribe().Channel(s.ch).Build(), func(m rueidis.PubSubMessage) { s.message(ctx, m.Message) })
		}
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			s.log.Warn("overrides: subscription to Redis lost; retrying", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// poll reads the version and catches up when Redis is ahead.
func (s *RedisStore) poll(ctx context.Context) {
	c, err := s.client()
	if err != nil {
		return
	}
	v, err := c.Do(ctx, c.B().Get().Key(s.vkey).Build()).AsInt64()
	if err != nil && !rueidis.IsRedisNil(err) {
		return
	}
	s.mu.Lock()
	behind := v != s.version || !s.synced
	s.mu.Unlock()
	if behind {
		if err := s.resync(ctx); err != nil && ctx.Err() == nil {
			s.log.Warn("overrides: reading them from Redis failed", "err", err)
		}
	}
}

// message applies one published change: in order, or after reading the
// hash again when one was missed.
func (s *RedisStore) message(ctx context.Context, msg string) {
	parts := strings.SplitN(msg, "\n", 4)
	if len(parts) != 4 {
		return
	}
	v, err := strconv.ParseInt(parts[0], 10, 64)
	if err != nil {
		return
	}
	if !s.applyChange(v, parts[1], parts[2], parts[3]) {
		if err := s.resync(ctx); err != nil && ctx.Err() == nil {
			s.log.Warn("overrides: reading them from Redis failed", "err", err)
		}
	}
}

// applyChange applies change v if it is the next one, and reports false
// when one was missed.
func (s *RedisStore) applyChange(v int64, op, id, raw string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case !s.synced:
		return false
	case v <= s.version:
		return true // applied already
	case v > s.version+1:
		return false
	}
	s.version = v
	s.applyLocked(op, id, raw)
	return true
}

// applyLocked puts or deletes one override in the copy and the index.
func (s *RedisStore) applyLocked(op, id, raw string) {
	if old := s.live[id]; old != nil {
		s.idx.Delete(old.Domain, old.Path)
		delete(s.live, id)
	}
	delete(s.raw, id)
	if op != "put" {
		return
	}
	o, err := decodeStored(raw)
	if err != nil {
		s.log.Warn("overrides: a bad override in Redis is ignored", "id", id, "err", err)
		return
	}
	if o.ID() != id {
		// Not written by this API (which keys each override by its ID):
		// enforced, it could not be removed through the API, and it
		// would race the override under its own ID for the index.
		s.log.Warn("overrides: an override in Redis under a field other than its ID is ignored", "field", id, "id", o.ID())
		s.raw[id] = raw // not warned of again until it changes
		return
	}
	id = o.ID() // one copy of the ID, the override's, for both maps
	s.live[id], s.raw[id] = o, raw
	s.idx.Put(o)
}

func decodeStored(raw string) (*Override, error) {
	var o Override
	if err := json.Unmarshal([]byte(raw), &o); err != nil {
		return nil, err
	}
	if err := o.Compile(); err != nil {
		return nil, err
	}
	return &o, nil
}

// resync reads the whole hash, and the version before and after, until
// they agree (a change during the read makes it read again), and puts
// the copy and the index in step with it.
func (s *RedisStore) resync(ctx context.Context) error {
	c, err := s.client()
	if err != nil {
		return err
	}
	for attempt := 0; ; attempt++ {
		v0, err := s.readVersion(ctx, c)
		if err != nil {
			return err
		}
		all := map[string]string{}
		var cursor uint64
		for {
			e, err := c.Do(ctx, c.B().Hscan().Key(s.hash).Cursor(cursor).Count(1000).Build()).AsScanEntry()
			if err != nil {
				return err
			}
			for i := 0; i+1 < len(e.Elements); i += 2 {
				all[e.Elements[i]] = e.Elements[i+1]
			}
			if cursor = e.Cursor; cursor == 0 {
				break
			}
		}
		v1, err := s.readVersion(ctx, c)
		if err != nil {
			return err
		}
		if v1 != v0 && attempt < 5 {
			continue
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		for id := range s.live {
			if _, ok := all[id]; !ok {
				s.applyLocked("delete", id, "")
			}
		}
		for id, raw := range all {
			if s.raw[id] != raw {
				s.applyLocked("put", id, raw)
			}
		}
		s.version, s.synced = v1, true
		return nil
	}
}

func (s *RedisStore) readVersion(ctx context.Context, c rueidis.Client) (int64, error) {
	v, err := c.Do(ctx, c.B().Get().Key(s.vkey).Build()).AsInt64()
	if rueidis.IsRedisNil(err) {
		return 0, nil
	}
	return v, err
}

// change runs the script and applies the change here at once.
func (s *RedisStore) change(ctx context.Context, op, id, raw, expect string) (int64, string, error) {
	c, err := s.client()
	if err != nil {
		return 0, "", err
	}
	res, err := changeScript.Exec(ctx, c, []string{s.hash, s.vkey}, []string{id, raw, s.ch, op, expect}).ToArray()
	if err != nil {
		return 0, "", err
	}
	if len(res) != 2 {
		return 0, "", fmt.Errorf("overrides: the change script answered %d values", len(res))
	}
	v, err := res[0].AsInt64()
	if err != nil {
		return 0, "", err
	}
	before, _ := res[1].ToString()
	if v > 0 && !s.applyChange(v, op, id, raw) {
		if err := s.resync(ctx); err != nil {
			s.log.Warn("overrides: reading them from Redis failed", "err", err)
		}
	}
	return v, before, nil
}

// Put adds or replaces o (validated here) in Redis, on behalf of by.
func (s *RedisStore) Put(o *Override, by string) (*Change, error) {
	if err := o.Compile(); err != nil {
		return nil, err
	}
	o.Updated, o.UpdatedBy = s.now().UTC(), by
	raw, err := json.Marshal(o)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, before, err := s.change(ctx, "put", o.ID(), string(raw), "")
	if err != nil {
		return nil, err
	}
	c := &Change{Op: "put", At: o.Updated, By: by, After: o}
	if before != "" {
		c.Before, _ = decodeStored(before)
	}
	return c, nil
}

// Delete removes the override of domain and path; the change is nil when
// there was none.
func (s *RedisStore) Delete(domain string, path []Entry, by string) (*Change, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	v, before, err := s.change(ctx, "delete", (&Override{Domain: domain, Path: path}).ID(), "", "")
	if err != nil || v == 0 {
		return nil, err
	}
	c := &Change{Op: "delete", At: s.now().UTC(), By: by}
	c.Before, _ = decodeStored(before)
	return c, nil
}

// Sweep deletes the overrides expired now, each only if it is still the
// one that expired (another node may sweep, or replace it, at the same
// time), and returns the changes this node made.
func (s *RedisStore) Sweep(ctx context.Context) ([]*Change, error) {
	now := s.now()
	s.mu.Lock()
	type exp struct{ id, raw string }
	var expired []exp
	for id, o := range s.live {
		if o.expired(now) {
			expired = append(expired, exp{id, s.raw[id]})
		}
	}
	s.mu.Unlock()
	var out []*Change
	var errs []error
	for _, e := range expired {
		v, before, err := s.change(ctx, "delete", e.id, "", e.raw)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if v > 0 {
			c := &Change{Op: "delete", At: now.UTC(), By: "expiry"}
			c.Before, _ = decodeStored(before)
			out = append(out, c)
			s.log.Info("override expired", "id", e.id)
		}
	}
	return out, errors.Join(errs...)
}
