package rlqs

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice/internal/testsupport/redistest"
)

// envoyModel is what one participant's Envoy enforces: the share it
// received last, until TTL after receiving it.
type envoyModel struct {
	share   float64
	until   time.Duration
	pending []delivery
}

type delivery struct {
	at    time.Duration
	share float64
}

// run replays a pool on a virtual clock: participants report every
// interval (with jitter) a demand that changes by phase, some die, and
// each answer reaches its Envoy after a random delay shorter than the
// grace. It calls check at every step with what the Envoys enforce.
type poolRun struct {
	n        int
	policy   Policy
	interval time.Duration
	dieAt    map[int]time.Duration
	demand   func(i int, t time.Duration) float64
	duration time.Duration
	seed     uint64
}

func (r poolRun) play(t *testing.T, pools Pools, setNow func(time.Time), check func(at time.Duration, enforced []float64, last []Share)) {
	t.Helper()
	rng := rand.New(rand.NewPCG(r.seed, 1))
	base := time.Unix(1_800_000_000, 0)
	envoys := make([]envoyModel, r.n)
	next := make([]time.Duration, r.n)
	last := make([]Share, r.n)
	for i := range next {
		next[i] = time.Duration(rng.Int64N(int64(r.interval)))
	}
	const step = 10 * time.Millisecond
	enforced := make([]float64, r.n)
	for at := time.Duration(0); at <= r.duration; at += step {
		setNow(base.Add(at))
		for i := range envoys {
			e := &envoys[i]
			for len(e.pending) > 0 && e.pending[0].at <= at {
				e.share, e.until = e.pending[0].share, e.pending[0].at+r.policy.TTL
				e.pending = e.pending[1:]
			}
			if d, ok := r.dieAt[i]; ok && at >= d {
				continue
			}
			if at < next[i] {
				continue
			}
			next[i] = at + r.interval + time.Duration(rng.Int64N(int64(r.interval/5)))
			out := make([]Share, 1)
			if err := pools.Assign(context.Background(), []Ask{{Pool: "p", Client: fmt.Sprintf("%032x", i), Demand: r.demand(i, at)}}, out); err != nil {
				t.Fatal(err)
			}
			last[i] = out[0]
			delay := time.Duration(rng.Int64N(int64(r.policy.Grace)))
			e.pending = append(e.pending, delivery{at: at + delay, share: out[0].Share})
		}
		for i, e := range envoys {
			enforced[i] = 0
			if at < e.until {
				enforced[i] = e.share
			}
		}
		check(at, enforced, last)
	}
}

// TestSharesNeverOversubscribed: whatever the demand does, however late the
// answers arrive (within the grace) and whichever participants die, the
// shares the Envoys enforce never sum to more than 1; the dead ones' shares
// go to the living after TTL+Grace; and steady demand converges to the
// max-min fair shares.
func TestSharesNeverOversubscribed(t *testing.T) {
	policy := Policy{TTL: 2 * time.Second, Grace: 500 * time.Millisecond}
	for seed := range uint64(6) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			r := poolRun{
				n: 6, policy: policy, interval: 400 * time.Millisecond, seed: seed,
				dieAt:    map[int]time.Duration{4: 12 * time.Second, 5: 12 * time.Second},
				duration: 30 * time.Second,
				demand: func(i int, at time.Duration) float64 {
					switch {
					case at < 6*time.Second: // uneven, together under the limit
						return []float64{0.05, 0.1, 0.15, 0.2, 0.1, 0.1}[i]
					case at < 20*time.Second: // every one wants it all, with a storm of changes
						return 0.5 + 0.5*math.Sin(float64(at)/float64(time.Second)*float64(i+1))
					}
					return []float64{0.05, 0.3, 0.6, 0.9, 1, 1}[i] // steady, over the limit
				},
			}
			now := time.Time{}
			pools := NewMemPools(policy, func() time.Time { return now })
			worst := 0.0
			var final []Share
			r.play(t, pools, func(t time.Time) { now = t }, func(at time.Duration, enforced []float64, last []Share) {
				sum := 0.0
				for _, s := range enforced {
					sum += s
				}
				worst = max(worst, sum)
				if sum > 1+1e-9 {
					t.Fatalf("at %v the Envoys enforce shares summing to %.6f: %v", at, sum, enforced)
				}
				if at == 5*time.Second && sum < 0.99 {
					t.Errorf("at %v, under the limit, the shares sum to %.3f, want the whole limit handed out", at, sum)
				}
				final = last
			})
			if worst < 0.999 {
				t.Errorf("the run never handed out the whole limit (worst sum %.3f): it tests nothing", worst)
			}
			// The living four, steady at 0.05, 0.3, 0.6 and 0.9 of the
			// limit: max-min fair is 0.05, 0.3, 0.325, 0.325.
			want := []float64{0.05, 0.3, 0.325, 0.325}
			for i, w := range want {
				if math.Abs(final[i].Fair-w) > 1e-9 {
					t.Errorf("participant %d: fair share %.4f, want %.4f", i, final[i].Fair, w)
				}
				if math.Abs(final[i].Share-w) > 0.1*w+1e-9 {
					t.Errorf("participant %d: share %.4f, want %.4f within the hysteresis", i, final[i].Share, w)
				}
			}
		})
	}
}

// Two participants of pool "p", and asker, which reports one's demand and
// returns its share.
const (
	a = "0000000000000000000000000000000a"
	b = "0000000000000000000000000000000b"
)

func asker(t *testing.T, pools Pools) func(client string, demand float64) Share {
	return func(client string, demand float64) Share {
		t.Helper()
		out := make([]Share, 1)
		if err := pools.Assign(context.Background(), []Ask{{Pool: "p", Client: client, Demand: demand}}, out); err != nil {
			t.Fatal(err)
		}
		return out[0]
	}
}

// TestNewcomerGetsShare: a pool handed out entirely to one participant
// makes room for a second within two of the first's reports, and never
// oversubscribes meanwhile.
func TestNewcomerGetsShare(t *testing.T) {
	policy := Policy{TTL: 2 * time.Second, Grace: 200 * time.Millisecond}
	now := time.Unix(1_800_000_000, 0)
	pools := NewMemPools(policy, func() time.Time { return now })
	ask := asker(t, pools)
	if s := ask(a, 2); s.Share != 1 {
		t.Fatalf("alone: share %v, want 1", s.Share)
	}
	if s := ask(b, 2); s.Share != 0 || s.Fair != 0.5 {
		t.Fatalf("newcomer while the pool is all taken: %+v, want share 0 and fair 0.5", s)
	}
	now = now.Add(time.Second)
	if s := ask(a, 2); s.Share != 0.5 {
		t.Fatalf("first one at its next report: share %v, want 0.5", s.Share)
	}
	if s := ask(b, 2); s.Share != 0 {
		t.Fatalf("newcomer within the grace of the first one's lowering: share %v, want 0", s.Share)
	}
	now = now.Add(policy.Grace)
	if s := ask(b, 2); s.Share != 0.5 {
		t.Fatalf("newcomer after the grace: share %v, want 0.5", s.Share)
	}
	// a dies: its record expires TTL+Grace after its last report (at 1s),
	// and then b gets all of it.
	now = now.Add(policy.TTL - 100*time.Millisecond)
	if s := ask(b, 2); s.Share != 0.5 {
		t.Fatalf("before a's record expires: share %v, want 0.5", s.Share)
	}
	now = now.Add(policy.Grace)
	if s := ask(b, 2); s.Share != 1 {
		t.Fatalf("after a's record expired: share %v, want 1", s.Share)
	}
	if pools.Len() != 1 {
		t.Fatalf("%d pools held, want 1", pools.Len())
	}
}

// TestRedisPoolsSameAsMemory: the Lua of RedisPools, on a real
// redis-server, gives the same shares, bit for bit, as the Go of MemPools
// for the same reports at the same times; and the invariant holds on it.
func TestRedisPoolsSameAsMemory(t *testing.T) {
	srv := redistest.Standalone(t)
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr()}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	policy := Policy{TTL: 2 * time.Second, Grace: 500 * time.Millisecond}
	for seed := range uint64(3) {
		now := time.Time{}
		mem := NewMemPools(policy, func() time.Time { return now })
		red := NewRedisPools(policy, func() (rueidis.Client, error) { return c, nil }, fmt.Sprintf("t%d-%d:", seed, time.Now().UnixNano()))
		red.now = func() time.Time { return now }
		rng := rand.New(rand.NewPCG(seed, 2))
		demands := make([]float64, 8)
		run := poolRun{
			n: 8, policy: policy, interval: 300 * time.Millisecond, seed: seed, duration: 8 * time.Second,
			dieAt: map[int]time.Duration{7: 3 * time.Second},
			demand: func(i int, at time.Duration) float64 {
				if rng.IntN(4) == 0 {
					demands[i] = rng.Float64() * 0.6
				}
				return demands[i]
			},
		}
		both := pair{mem: mem, red: red, t: t}
		calls := 0
		run.play(t, &both, func(t time.Time) { now = t }, func(at time.Duration, enforced []float64, _ []Share) {
			sum := 0.0
			for _, s := range enforced {
				sum += s
			}
			if sum > 1+1e-9 {
				t.Fatalf("seed %d at %v: shares sum to %.6f", seed, at, sum)
			}
			calls = both.calls
		})
		if calls < 100 {
			t.Fatalf("seed %d: %d reports compared, want at least 100", seed, calls)
		}
	}
}

// pair asks both pools and fails the test when they differ.
type pair struct {
	mem   *MemPools
	red   *RedisPools
	t     *testing.T
	calls int
}

func (p *pair) Assign(ctx context.Context, asks []Ask, out []Share) error {
	red := make([]Share, len(out))
	if err := p.red.Assign(ctx, asks, red); err != nil {
		return err
	}
	if err := p.mem.Assign(ctx, asks, out); err != nil {
		return err
	}
	p.calls++
	for i := range out {
		if math.Float64bits(out[i].Share) != math.Float64bits(red[i].Share) || math.Float64bits(out[i].Fair) != math.Float64bits(red[i].Fair) {
			p.t.Fatalf("report %d of %s: Go %+v, Lua %+v", p.calls, asks[i].Client, out[i], red[i])
		}
	}
	return nil
}

// TestLoweringsHeld: a share lowered twice within the grace keeps the first
// old share committed until the grace of the first lowering is over (its
// Envoy may not have heard of either lowering yet): the second lowering
// waits, and nobody gets the room meanwhile.
func TestLoweringsHeld(t *testing.T) {
	policy := Policy{TTL: 5 * time.Second, Grace: 2 * time.Second}
	now := time.Unix(1_800_000_000, 0)
	pools := NewMemPools(policy, func() time.Time { return now })
	ask := asker(t, pools)
	if s := ask(a, 2); s.Share != 1 {
		t.Fatalf("alone: %v", s.Share)
	}
	ask(b, 0.5) // b wants half: a's fair share drops to 0.5
	now = now.Add(100 * time.Millisecond)
	if s := ask(a, 2); s.Share != 0.5 {
		t.Fatalf("a lowered to its fair share: %v, want 0.5", s.Share)
	}
	now = now.Add(time.Second) // within the grace of that lowering
	ask(b, 0.9)                // b wants more, and a less: a's fair share drops again
	if s := ask(a, 0.25); s.Share != 0.5 {
		t.Fatalf("a lowered again within the grace: %v, want 0.5 kept until the first lowering's grace is over", s.Share)
	}
	if s := ask(b, 0.9); s.Share != 0 {
		t.Fatalf("b within the grace of a's first lowering: %v, want 0 (a's Envoy may still enforce 1)", s.Share)
	}
	now = now.Add(time.Second) // the first lowering's grace is over
	if s := ask(b, 0.9); s.Share != 0.5 {
		t.Fatalf("b after the grace: %v, want the 0.5 a gave up", s.Share)
	}
	if s := ask(a, 0.25); s.Share != 0.25 {
		t.Fatalf("a's second lowering, now: %v, want 0.25", s.Share)
	}
}
