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

	"github.com/sluicehq/sluice/internal/base/logsample"
)

// changeLua applies the steps of one change to the overrides hash,
// atomically: each step puts or deletes one field, bumps the version and
// publishes what it did ("version\nop\nfield\nJSON"), so that a node
// applies the steps one by one in version order. KEYS: the hash, the
// version. ARGV: the channel, then four strings a step: op (put or
// delete), field, the JSON to put, and what the field must hold before
// the change: '*' anything, an empty string nothing, else that JSON.
// Nothing changes
// when a field does not hold what its step expects: the answer is then
// {-1}. Otherwise {1, each step's version (0 for a delete of nothing)}.
const changeLua = `
local n = (#ARGV - 1) / 4
for i = 0, n - 1 do
  local e = ARGV[i*4 + 5]
  if e ~= '*' and (redis.call('HGET', KEYS[1], ARGV[i*4 + 3]) or '') ~= e then return {-1} end
end
local out = {1}
for i = 0, n - 1 do
  local op, f, raw = ARGV[i*4 + 2], ARGV[i*4 + 3], ARGV[i*4 + 4]
  local v = 0
  if op == 'put' then
    redis.call('HSET', KEYS[1], f, raw)
  elseif redis.call('HDEL', KEYS[1], f) == 0 then
    op = ''
  end
  if op ~= '' then
    v = redis.call('INCR', KEYS[2])
    redis.call('PUBLISH', ARGV[1], v .. '\n' .. op .. '\n' .. f .. '\n' .. raw)
  end
  out[#out + 1] = v
end
return out
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
//
// The hash keys each override by its ID. Versions before IDs were
// escaped keyed it by its domain and path unescaped (two paths could then
// share a field); an override still stored under that legacy field is
// read, listed, enforced and deleted as any other, and moved under its ID
// by the next put of it (a put of another override whose ID is that field
// moves it first). When one override is stored under both, the one
// updated last is in force. A field that is neither the ID nor the legacy
// field of the override it holds is ignored, with a warning.
type RedisStore struct {
	client func() (rueidis.Client, error)
	hash   string
	vkey   string
	ch     string
	idx    *Index
	now    func() time.Time
	log    *slog.Logger

	liveSet                        // by ID: the override in force
	fields  map[string]storedField // by hash field: the copy of the hash
	version int64                  // the last change applied
	synced  bool
}

// storedField is one field of the hash: its JSON and, unless it is
// ignored, the override it holds.
type storedField struct {
	raw string
	o   *Override
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
		idx: idx, now: now, log: log, liveSet: liveSet{live: map[string]*Override{}}, fields: map[string]storedField{}}
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

// The waits between tries to subscribe double from retryMin to retryMax,
// and start again from retryMin after a subscription that held
// retryMax or more; a run of failures is logged at once, then at most
// once per retryLogEvery with the count of failures since the last
// line. A Redis that refuses every try (a wrong password) so costs a try
// every 5 s and a log line a minute, not 5 of each a second.
const (
	retryMin      = 200 * time.Millisecond
	retryMax      = 5 * time.Second
	retryLogEvery = time.Minute
)

// subscribe receives the changes, reading the hash again before each
// (re)subscription.
func (s *RedisStore) subscribe(ctx context.Context) {
	delay := retryMin
	failures := logsample.Sampler{Interval: retryLogEvery}
	for ctx.Err() == nil {
		start := time.Now()
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
		if time.Since(start) >= retryMax {
			// It held: its loss starts a new run of failures.
			delay, failures = retryMin, logsample.Sampler{Interval: retryLogEvery}
		}
		if err != nil {
			if dropped, ok := failures.Allow(time.Now()); ok {
				s.log.Warn("overrides: subscription to Redis lost; retrying", "err", err, "retry_in", delay, "failures_not_logged", dropped)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
		delay = min(2*delay, retryMax)
	}
}

// poll reads the version and catches up when Redis is ahead.
func (s *RedisStore) poll(ctx context.Context) {
	c, err := s.client()
	if err != nil {
		return
	}
	v, err := c.Do(ctx, c.B().Get().Key(s.vkey).Build().Pin()).AsInt64()
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
func (s *RedisStore) applyChange(v int64, op, field, raw string) bool {
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
	s.applyLocked(op, field, raw)
	return true
}

// applyLocked puts or deletes one field in the copy, and puts the index
// in step with it.
func (s *RedisStore) applyLocked(op, field, raw string) {
	old := s.fields[field]
	if op != "put" {
		delete(s.fields, field)
	} else {
		f := storedField{raw: raw}
		o, err := decodeStored(raw)
		switch {
		case err != nil:
			s.log.Warn("overrides: a bad override in Redis is ignored", "field", field, "err", err)
		case o.ID() != field && legacyID(o) != field:
			// Not written by this API (which keys each override by its
			// ID): enforced, it could not be removed through the API,
			// and it would race the override under its own ID.
			s.log.Warn("overrides: an override in Redis under a field other than its ID is ignored", "field", field, "id", o.ID())
		default:
			f.o = o
			if o.ID() == field {
				field = o.ID() // one copy of the ID, the override's, for both maps
			}
		}
		s.fields[field] = f // an ignored one is not warned of again until it changes
	}
	if old.o != nil {
		s.elect(old.o)
	}
	if n := s.fields[field].o; n != nil && (old.o == nil || n.ID() != old.o.ID()) {
		s.elect(n)
	}
}

// elect puts in force the override of o's ID that the copy holds: under
// the ID, or under the legacy field, the one updated last (under the ID
// when both were updated at once); none when neither holds one.
func (s *RedisStore) elect(o *Override) {
	id := o.ID()
	in := s.candidate(id, id)
	if lf := legacyID(o); lf != id {
		if l := s.candidate(lf, id); l != nil && (in == nil || l.Updated.After(in.Updated)) {
			in = l
		}
	}
	switch cur := s.live[id]; {
	case in == cur:
	case in == nil:
		delete(s.live, id)
		s.idx.Delete(cur.Domain, cur.Path)
	default:
		s.live[id] = in
		s.idx.Put(in)
	}
}

// candidate returns the override under field if its ID is id.
func (s *RedisStore) candidate(field, id string) *Override {
	if o := s.fields[field].o; o != nil && o.ID() == id {
		return o
	}
	return nil
}

func decodeStored(raw string) (*Override, error) {
	var o Override
	if err := json.Unmarshal([]byte(raw), &o); err != nil {
		return nil, err
	}
	if err := o.compile(false); err != nil {
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
			e, err := c.Do(ctx, c.B().Hscan().Key(s.hash).Cursor(cursor).Count(1000).Build().Pin()).AsScanEntry()
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
		for field := range s.fields {
			if _, ok := all[field]; !ok {
				s.applyLocked("delete", field, "")
			}
		}
		for field, raw := range all {
			if f, ok := s.fields[field]; !ok || f.raw != raw {
				s.applyLocked("put", field, raw)
			}
		}
		s.version, s.synced = v1, true
		return nil
	}
}

func (s *RedisStore) readVersion(ctx context.Context, c rueidis.Client) (int64, error) {
	v, err := c.Do(ctx, c.B().Get().Key(s.vkey).Build().Pin()).AsInt64()
	if rueidis.IsRedisNil(err) {
		return 0, nil
	}
	return v, err
}

// step is one step of a change: put raw in field, or delete field, if
// the field holds expect ("*": anything, empty: nothing).
type step struct{ op, field, raw, expect string }

// errConflict: a field did not hold what a step expected.
var errConflict = errors.New("overrides: changed meanwhile")

// change runs the script and applies its steps here at once.
func (s *RedisStore) change(ctx context.Context, steps []step) ([]int64, error) {
	c, err := s.client()
	if err != nil {
		return nil, err
	}
	args := []string{s.ch}
	for _, st := range steps {
		args = append(args, st.op, st.field, st.raw, st.expect)
	}
	res, err := changeScript.Exec(ctx, c, []string{s.hash, s.vkey}, args).AsIntSlice()
	if err != nil {
		return nil, err
	}
	if len(res) == 1 && res[0] == -1 {
		return nil, errConflict
	}
	if len(res) != len(steps)+1 {
		return nil, fmt.Errorf("overrides: the change script answered %d values for %d steps", len(res), len(steps))
	}
	vs := res[1:]
	for i, v := range vs {
		if v > 0 && !s.applyChange(v, steps[i].op, steps[i].field, steps[i].raw) {
			if err := s.resync(ctx); err != nil {
				s.log.Warn("overrides: reading them from Redis failed", "err", err)
			}
			break
		}
	}
	return vs, nil
}

// maxAttempts bounds the attempts of a put or a delete whose fields other
// nodes keep changing between its read and its write.
const maxAttempts = 5

// read returns what the given fields of the hash hold ("" for nothing),
// with each one's override ("" and nil for nothing or what is not an
// override).
func (s *RedisStore) read(ctx context.Context, fields ...string) ([]storedField, error) {
	c, err := s.client()
	if err != nil {
		return nil, err
	}
	vals, err := c.Do(ctx, c.B().Hmget().Key(s.hash).Field(fields...).Build().Pin()).ToArray()
	if err != nil {
		return nil, err
	}
	out := make([]storedField, len(fields))
	for i, v := range vals {
		if raw, err := v.ToString(); err == nil {
			out[i].raw = raw
			out[i].o, _ = decodeStored(raw)
		}
	}
	return out, nil
}

// held returns what the hash holds of the override with ID id: the
// override under its ID (at), and under its legacy field (leg, when
// different), each nil when the field holds something else.
func held(id string, at, leg storedField) (*Override, *Override) {
	var a, l *Override
	if at.o != nil && at.o.ID() == id {
		a = at.o
	}
	if leg.o != nil && leg.o.ID() == id {
		l = leg.o
	}
	return a, l
}

// inForce is the one of a and l in force: the one updated last, a on a
// tie.
func inForce(a, l *Override) *Override {
	if l != nil && (a == nil || l.Updated.After(a.Updated)) {
		return l
	}
	return a
}

// Put adds or replaces o (validated here) in Redis, on behalf of by. It
// is stored under its ID, and removed from its legacy field; an override
// that an older version stored under the field of o's ID is moved under
// its own ID first.
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
	id, lf := o.ID(), legacyID(o)
	for range maxAttempts {
		got, err := s.read(ctx, id, lf)
		if err != nil {
			return nil, err
		}
		at, leg := got[0], got[1]
		var steps []step
		if x := at.o; x != nil && x.ID() != id && legacyID(x) == id {
			// Another override, stored by an older version under its
			// legacy field, which is o's ID: under its own ID unless
			// one updated later is there already.
			mine, err := s.read(ctx, x.ID())
			if err != nil {
				return nil, err
			}
			if cur, _ := held(x.ID(), mine[0], storedField{}); inForce(cur, x) == x {
				steps = append(steps, step{"put", x.ID(), at.raw, mine[0].raw})
			}
		}
		steps = append(steps, step{"put", id, string(raw), at.raw})
		a, l := held(id, at, leg)
		if lf != id && l != nil {
			steps = append(steps, step{"delete", lf, "", leg.raw})
		}
		if _, err := s.change(ctx, steps); errors.Is(err, errConflict) {
			continue
		} else if err != nil {
			return nil, err
		}
		return &Change{Op: "put", At: o.Updated, By: by, Before: inForce(a, l), After: o}, nil
	}
	return nil, fmt.Errorf("overrides: %s changed by other nodes %d times while being put; try again", id, maxAttempts)
}

// Delete removes the override of domain and path, under its ID and under
// its legacy field; the change is nil when there was none.
func (s *RedisStore) Delete(domain string, path []Entry, by string) (*Change, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	target := &Override{Domain: domain, Path: path}
	id, lf := target.ID(), legacyID(target)
	for range maxAttempts {
		got, err := s.read(ctx, id, lf)
		if err != nil {
			return nil, err
		}
		a, l := held(id, got[0], got[1])
		var steps []step
		if a != nil {
			steps = append(steps, step{"delete", id, "", got[0].raw})
		}
		if lf != id && l != nil {
			steps = append(steps, step{"delete", lf, "", got[1].raw})
		}
		if len(steps) == 0 {
			return nil, nil
		}
		if _, err := s.change(ctx, steps); errors.Is(err, errConflict) {
			continue
		} else if err != nil {
			return nil, err
		}
		return &Change{Op: "delete", At: s.now().UTC(), By: by, Before: inForce(a, l)}, nil
	}
	return nil, fmt.Errorf("overrides: %s changed by other nodes %d times while being deleted; try again", id, maxAttempts)
}

// Sweep deletes the overrides expired now, each only if it is still the
// one that expired (another node may sweep, or replace it, at the same
// time), and returns the changes this node made.
func (s *RedisStore) Sweep(ctx context.Context) ([]*Change, error) {
	now := s.now()
	type exp struct {
		field string
		f     storedField
	}
	var expired []exp
	s.mu.Lock()
	for field, f := range s.fields {
		if f.o != nil && f.o.expired(now) {
			expired = append(expired, exp{field, f})
		}
	}
	s.mu.Unlock()
	var out []*Change
	var errs []error
	for _, e := range expired {
		vs, err := s.change(ctx, []step{{"delete", e.field, "", e.f.raw}})
		if errors.Is(err, errConflict) {
			continue // changed since: not the override that expired
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if vs[0] > 0 {
			out = append(out, &Change{Op: "delete", At: now.UTC(), By: "expiry", Before: e.f.o})
			s.log.Info("override expired", "id", e.f.o.ID())
		}
	}
	return out, errors.Join(errs...)
}
