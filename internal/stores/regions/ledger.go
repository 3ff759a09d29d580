package regions

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/rueidis"
	"github.com/zeebo/xxh3"
)

// Ledger is the coordinator's ledger of allocations: per key, window and
// region, what the region may admit; a region absent from a window's entry
// holds its safe share. Both calls are atomic at the coordinator.
type Ledger interface {
	// Grant gives region up to want of what no region holds of limit in
	// the window starting at window (Unix ns), never letting the
	// allocations exceed limit; it returns what it gave.
	Grant(ctx context.Context, e Entry, want int64) (int64, error)
	// GiveBack returns x of region's allocation to the ledger.
	GiveBack(ctx context.Context, e Entry, x int64) error
	// Allocation returns region's allocation in the entry.
	Allocation(ctx context.Context, e Entry) (int64, error)
	// Wanted lists the entries of windows not ended at now (Unix ms)
	// that a region asked more of than was free: a region holding what
	// it does not use of one gives it back.
	Wanted(ctx context.Context, now int64) ([]Wanted, error)
}

// Entry names one ledger entry and the region asking.
type Entry struct {
	Key    string  // the counter's key and the limit's identity (entryKey)
	Window int64   // the window's start, Unix ns
	Period int64   // the window's length, ns
	TTL    int64   // ns the entry lives from its last change: a period and more
	Limit  int64   // the global limit L
	Region int     // the asking region's index in Shares
	Shares []int64 // every region's safe share
}

// RedisLedger keeps the ledger in the coordinator's Redis (or Redis
// Cluster: every entry is one hash, in one slot): an entry per key and
// window, a field per region that has asked or given back, whose absence
// means the region's safe share.
type RedisLedger struct {
	Client func() (rueidis.Client, error) // the coordinator's client
	Prefix string
}

// ledgerLua is grant ("g") and give-back ("b"). KEYS[1] the entry, KEYS[2]
// the wanted set; ARGV: the operation, the region (1-based), the amount,
// the limit L, the entry's time to live in ms, the window's end in ms and
// the entry as a member of the wanted set, then every region's safe
// share. A grant gives Grantable (at most half of what no region holds):
// the Lua mirrors it, and TestGrantableLua holds them together.
var ledgerLua = rueidis.NewLuaScript(`
local n = #ARGV - 7
local alloc = {}
for i = 1, n do alloc[i] = tonumber(ARGV[7 + i]) end
local h = redis.call('HGETALL', KEYS[1])
for j = 1, #h, 2 do alloc[tonumber(h[j])] = tonumber(h[j + 1]) end
local r, amt, L = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local moved = 0
if ARGV[1] == 'g' then
  local sum = 0
  for i = 1, n do sum = sum + alloc[i] end
  local free = L - sum
  if free > 0 then
    moved = math.min(amt, math.max(math.ceil(free / 2), math.min(free, 1)))
  end
  if moved < amt then
    -- Short: the regions that hold what they do not use are asked to
    -- give it back (Wanted), until the window ends.
    redis.call('ZADD', KEYS[2], ARGV[6], ARGV[7])
    redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. (tonumber(ARGV[6]) - tonumber(ARGV[5])))
    redis.call('PEXPIRE', KEYS[2], ARGV[5])
  end
else
  moved = -math.min(amt, alloc[r])
end
if moved ~= 0 then
  alloc[r] = alloc[r] + moved
  redis.call('HSET', KEYS[1], tostring(r), string.format('%d', alloc[r]))
  redis.call('PEXPIRE', KEYS[1], ARGV[5])
end
return {string.format('%d', moved), string.format('%d', alloc[r])}
`)

func (l *RedisLedger) call(ctx context.Context, op string, e Entry, amt int64) (int64, error) {
	c, err := l.Client()
	if err != nil {
		return 0, err
	}
	key := l.entry(e)
	end := (e.Window + e.Period) / 1e6
	// The entry lives TTL from its last change: its window ends within
	// a period of now, and TTL is a period and more.
	args := []string{op, strconv.Itoa(e.Region + 1), strconv.FormatInt(amt, 10), strconv.FormatInt(e.Limit, 10), strconv.FormatInt(e.TTL/1e6, 10),
		strconv.FormatInt(end, 10), member(e)}
	for _, sh := range e.Shares {
		args = append(args, strconv.FormatInt(sh, 10))
	}
	v, err := ledgerLua.Exec(ctx, c, []string{key, l.wanted()}, args).AsStrSlice()
	if err != nil {
		return 0, err
	}
	if len(v) != 2 {
		return 0, fmt.Errorf("regions: the ledger answered %q", v)
	}
	return strconv.ParseInt(v[0], 10, 64)
}

// Grant implements Ledger.
func (l *RedisLedger) Grant(ctx context.Context, e Entry, want int64) (int64, error) {
	return l.call(ctx, "g", e, want)
}

// GiveBack implements Ledger.
func (l *RedisLedger) GiveBack(ctx context.Context, e Entry, x int64) error {
	_, err := l.call(ctx, "b", e, x)
	return err
}

// wanted is the key of the wanted set: the entries a region was granted
// less than it asked, scored by their window's end (ms).
func (l *RedisLedger) wanted() string { return l.Prefix + "{ledger}wanted" }

// Wanted implements Ledger: the entries of windows not ended at now (ms,
// the caller's clock) that a region asked more of than was free.
func (l *RedisLedger) Wanted(ctx context.Context, now int64) ([]Wanted, error) {
	c, err := l.Client()
	if err != nil {
		return nil, err
	}
	// Pinned: rueidis recycles a command once answered, and the race
	// detector, which does not see the answer come after the command
	// was written, reported that as a race with the pipe's writer (a
	// -race node under load halted on it). This call runs every round.
	vs, err := c.Do(ctx, c.B().Zrangebyscore().Key(l.wanted()).Min(strconv.FormatInt(now, 10)).Max("+inf").Build().Pin()).AsStrSlice()
	if err != nil {
		return nil, err
	}
	var out []Wanted
	for _, v := range vs {
		if w, ok := parseWanted(v); ok {
			out = append(out, w)
		}
	}
	return out, nil
}

// Wanted is an entry a region was granted less of than it asked.
type Wanted struct {
	Window       int64 // start, Unix ns
	Key          string
	Rate, Period int64
	Name         string
}

// entryKey is the ledger's name of key under a limit: what Wanted parses.
func entryKey(key string, rate, period int64, name string) string {
	return key + "\x00" + strconv.FormatInt(rate, 10) + "\x00" + strconv.FormatInt(period, 10) + "\x00" + name
}

// member is e's member of the wanted set: its window, then its key.
func member(e Entry) string { return strconv.FormatInt(e.Window, 10) + "\x00" + e.Key }

// Wanted returns e as Ledger.Wanted lists it, for a ledger kept elsewhere
// than in Redis (cmd/regionsim's).
func (e Entry) Wanted() (Wanted, bool) { return parseWanted(member(e)) }

// parseWanted parses a member of the wanted set.
func parseWanted(v string) (Wanted, bool) {
	f := strings.Split(v, "\x00")
	if len(f) < 5 {
		return Wanted{}, false
	}
	// The key may hold NULs: the window first, the rate, period and name
	// last.
	n := len(f)
	w, err1 := strconv.ParseInt(f[0], 10, 64)
	rate, err2 := strconv.ParseInt(f[n-3], 10, 64)
	per, err3 := strconv.ParseInt(f[n-2], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil || per <= 0 || rate <= 0 {
		return Wanted{}, false
	}
	return Wanted{Window: w, Key: strings.Join(f[1:n-3], "\x00"), Rate: rate, Period: per, Name: f[n-1]}, true
}

// Allocation implements Ledger.
func (l *RedisLedger) Allocation(ctx context.Context, e Entry) (int64, error) {
	c, err := l.Client()
	if err != nil {
		return 0, err
	}
	key := l.entry(e)
	v, err := c.Do(ctx, c.B().Hget().Key(key).Field(strconv.Itoa(e.Region+1)).Build().Pin()).AsInt64()
	if rueidis.IsRedisNil(err) {
		return e.Shares[e.Region], nil
	}
	return v, err
}

// entry is the Redis key of e's ledger entry: in the {ledger} slot.
func (l *RedisLedger) entry(e Entry) string {
	return l.Prefix + "{ledger}" + strconv.FormatUint(xxh3.HashString(e.Key), 16) + ":" + strconv.FormatInt(e.Window, 10)
}
