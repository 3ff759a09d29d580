package hitters

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/zeebo/xxh3"
)

func name(s string) func([]byte) []byte { return func(b []byte) []byte { return append(b, s...) } }

// newSummary is a fed summary of m counters; newMerged a merged one.
func newSummary(m int) *summary {
	s := &summary{}
	s.init(m)
	return s
}

func newMerged(m int) *summary {
	s := &summary{}
	s.initMerged(m)
	return s
}

// TestBound: a Zipf stream over 50,000 keys into summaries of 64
// counters: every key with more than N/m hits of the minute is listed,
// and every listed key's true count is within [Low, High], with High at
// most N/m above it; the hour, made of merged summaries, holds the same.
func TestBound(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	tr := New(Config{Counters: 64, Now: func() time.Time { return now }})
	rng := rand.New(rand.NewPCG(1, 2))
	zipf := rand.NewZipf(rng, 1.2, 1, 49_999)
	truth := map[string]uint64{}
	var n uint64
	for i := range 200_000 {
		if i%4000 == 0 {
			now = now.Add(time.Second) // 50 s: the minute holds it all
		}
		k := "user=" + strconv.FormatUint(zipf.Uint64(), 10)
		truth[k]++
		n++
		tr.Add("api.user", xxh3.HashString(k), Allowed, name(k))
	}
	for _, hour := range []bool{false, true} {
		items, total := tr.Top("api.user", Requests, hour, 1000)
		if total != n {
			t.Fatalf("hour %v: %d hits in the window, want %d", hour, total, n)
		}
		bound := n / 64
		listed := map[string]bool{}
		for _, it := range items {
			listed[it.Key] = true
			tc := truth[it.Key]
			if tc < it.Low || tc > it.High {
				t.Errorf("hour %v: %s: true count %d outside [%d, %d]", hour, it.Key, tc, it.Low, it.High)
			}
			if it.High-tc > bound {
				t.Errorf("hour %v: %s: overestimated by %d, more than N/m = %d", hour, it.Key, it.High-tc, bound)
			}
		}
		heavy := 0
		for k, c := range truth {
			if c > bound {
				heavy++
				if !listed[k] {
					t.Errorf("hour %v: %s has %d hits, more than N/m = %d, and is not listed", hour, k, c, bound)
				}
			}
		}
		if heavy < 5 {
			t.Fatalf("only %d keys above N/m: the stream tests nothing", heavy)
		}
		if items[0].Key != "user=0" {
			t.Errorf("hour %v: the top key is %s, want user=0", hour, items[0].Key)
		}
	}
}

// TestWindows: hits older than a minute leave the minute but stay in the
// hour; older than an hour, they leave it too. Denials are kept apart.
func TestWindows(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	tr := New(Config{Now: func() time.Time { return now }})
	for range 100 {
		tr.Add("r", 1, Denied, name("old"))
	}
	now = now.Add(2 * time.Minute)
	for range 10 {
		tr.Add("r", 2, Allowed, name("new"))
	}
	top := func(kind Kind, hour bool) string {
		items, total := tr.Top("r", kind, hour, 10)
		return fmt.Sprint(items, " ", total)
	}
	if got := top(Requests, false); got != "[{new 10 10 false <nil> 0}] 10" {
		t.Errorf("minute: %s", got)
	}
	if got := top(Requests, true); got != "[{old 100 100 false <nil> 0} {new 10 10 false <nil> 0}] 110" {
		t.Errorf("hour: %s", got)
	}
	if got := top(Denials, true); got != "[{old 100 100 false <nil> 0}] 100" {
		t.Errorf("hour's denials: %s", got)
	}
	now = now.Add(61 * time.Minute)
	if got := top(Requests, true); got != "[] 0" {
		t.Errorf("an hour later: %s", got)
	}
}

// TestFloodConstantMemory: ten million random keys do not grow the
// tracker's memory, and the one heavy key among them stays on top.
func TestFloodConstantMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("ten million adds")
	}
	now := time.Unix(1_800_000_000, 0)
	tr := New(Config{Now: func() time.Time { return now }})
	rng := rand.New(rand.NewPCG(3, 4))
	var buf [32]byte
	flood := func(n int) {
		for i := range n {
			if i%10 == 0 {
				tr.Add("api.ip", 42, Denied, name("ip=attacker"))
				continue
			}
			h := rng.Uint64()
			tr.Add("api.ip", h, Denied, func(b []byte) []byte { return append(b, strconv.AppendUint(buf[:0], h, 16)...) })
		}
	}
	flood(1_000_000) // every summary full
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	n := 10_000_000
	if raceEnabled {
		n = 2_000_000 // the same test, ten times slower under -race
	}
	flood(n)
	runtime.GC()
	runtime.ReadMemStats(&after)
	grew := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("heap before %d B, after %d random keys %d B (%+d)", before.HeapAlloc, n, after.HeapAlloc, grew)
	if grew > 64<<10 {
		t.Errorf("the heap grew by %d B over %d random keys", grew, n)
	}
	items, _ := tr.Top("api.ip", Denials, false, 3)
	if len(items) == 0 || items[0].Key != "ip=attacker" {
		t.Errorf("the heavy key is not on top: %v", items)
	}
}

// TestMaxRules: rules beyond the cap are counted, not tracked.
func TestMaxRules(t *testing.T) {
	tr := New(Config{MaxRules: 2})
	defer tr.Close()
	for i := range 5 {
		tr.Add(fmt.Sprint("rule", i), 1, Allowed, name("k"))
	}
	if len(tr.Rules()) != 2 || tr.Untracked.Load() != 3 {
		t.Errorf("%d rules tracked, %d hits untracked; want 2 and 3", len(tr.Rules()), tr.Untracked.Load())
	}
}

// BenchmarkAdd: one request of a rule recorded, what the server adds to
// a decision (besides hashing the key), over streams of keys: one key; a
// Zipf stream over a million keys; 10,000 keys taken evenly (each rarely
// held); a flood of keys never seen before; allowed, and denied (which
// records twice: requests and denials). The hashes are drawn before the
// clock starts.
func BenchmarkAdd(b *testing.B) {
	const n = 1 << 20
	rng := rand.New(rand.NewPCG(5, 6))
	zipf := rand.NewZipf(rng, 1.1, 1, 999_999)
	streams := map[string][]uint64{"held": {7}, "zipf": make([]uint64, n), "even-10k": make([]uint64, n), "flood": make([]uint64, n)}
	for i := range n {
		streams["zipf"][i] = xxh3.HashString("user=" + strconv.FormatUint(zipf.Uint64(), 10))
		streams["even-10k"][i] = xxh3.HashString("user=" + strconv.Itoa(rng.IntN(10_000)))
		streams["flood"][i] = rng.Uint64()
	}
	for _, stream := range []string{"held", "zipf", "even-10k", "flood"} {
		for _, o := range []Outcome{Allowed, Denied} {
			b.Run(fmt.Sprintf("%s/%s", stream, map[Outcome]string{Allowed: "allowed", Denied: "denied"}[o]), func(b *testing.B) {
				tr := New(Config{})
				defer tr.Close()
				hs := streams[stream]
				nm := name("user=someone")
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					tr.Add("api.user", hs[i&(len(hs)-1)], o, nm)
					i++
				}
			})
		}
	}
}

// TestRuleMemory: what a rule tracked costs, every summary of both kinds
// allocated and its counters full, is what docs/observability.md says
// (about 390 KB; the test allows 420 KB), whatever the keys: the memory
// bound of the tracker is this times MaxRules.
func TestRuleMemory(t *testing.T) {
	const rules = 20
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	tr := New(Config{})
	defer tr.Close()
	for r := range rules {
		rule := fmt.Sprint("rule", r)
		for k := range 64 * 20 {
			key := fmt.Sprint("user=", k)
			o := Allowed
			if k%2 == 0 {
				o = Denied
			}
			tr.Add(rule, xxh3.HashString(key), o, name(key))
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	per := (int64(after.HeapAlloc) - int64(before.HeapAlloc)) / rules
	t.Logf("%d B a rule", per)
	if per > 420<<10 {
		t.Errorf("%d B a rule tracked, over the 420 KB the docs' bound allows", per)
	}
	runtime.KeepAlive(tr)
}

// TestFilterInvariants checks the filtered summary's two invariants and
// what follows from them after every hit of streams made to evict often
// (8 counters, a few hundred keys, skewed and even): a key held has a
// count at least its true count and an error at most N/m; a key not held
// has at most its cell's hits, and its cell is at most the smallest count,
// which is at most N/m.
func TestFilterInvariants(t *testing.T) {
	for seed := range uint64(6) {
		rng := rand.New(rand.NewPCG(seed, 99))
		keys := 50 + int(seed)*100
		zipf := rand.NewZipf(rng, 1.05+float64(seed)/10, 1, uint64(keys-1))
		s := newSummary(8)
		truth := make([]uint64, keys)
		hash := func(k int) uint64 { return xxh3.HashString("k" + strconv.Itoa(k)) }
		for i := range 20_000 {
			k := int(zipf.Uint64())
			if i%3 == 0 {
				k = rng.IntN(keys)
			}
			truth[k]++
			s.hit(hash(k), name("k"+strconv.Itoa(k)))
			if i%7 != 0 {
				continue
			}
			n := s.total
			mn := s.floor
			if len(s.cnt) == cap(s.cnt) {
				least := s.cnt[0].count
				for _, c := range s.cnt {
					least = min(least, c.count)
				}
				if mn != least {
					t.Fatalf("seed %d, hit %d: the floor is %d, the smallest count %d", seed, i, mn, least)
				}
			}
			heldIn := make(map[int]int)
			for _, c := range s.cnt {
				heldIn[s.cell(c.hash)]++
			}
			for j, v := range s.alpha {
				if got, want := int(v>>cellShift), min(heldIn[j], cellHeldMax); got != want {
					t.Fatalf("seed %d, hit %d: cell %d counts %d keys held, holds %d", seed, i, j, got, heldIn[j])
				}
			}
			if mn > n/8 {
				t.Fatalf("seed %d, hit %d: smallest count %d over N/m = %d", seed, i, mn, n/8)
			}
			for j := range keys {
				h := hash(j)
				if c := s.find(h); c >= 0 {
					cnt := &s.cnt[c]
					if cnt.count < truth[j] || cnt.count-cnt.err > truth[j] || cnt.err > n/8 {
						t.Fatalf("seed %d, hit %d: key %d held with count %d, error %d; true %d, N/m %d", seed, i, j, cnt.count, cnt.err, truth[j], n/8)
					}
				} else if b := s.bound(h); truth[j] > b || b > mn {
					t.Fatalf("seed %d, hit %d: key %d not held, true %d, cell %d, smallest count %d", seed, i, j, truth[j], b, mn)
				}
			}
		}
	}
}

// TestKeyHash: entries hash apart however their bytes are split between
// key and value or between entries, and are written as the dashboard
// reads them.
func TestKeyHash(t *testing.T) {
	seen := map[KeyHash]string{}
	for _, c := range [][]string{{"ab", "c"}, {"a", "bc"}, {"abc", ""}, {"", "abc"}, {"a", "b", "c", ""}, {"a", "", "bc", ""}} {
		h := NewKeyHash
		var b []byte
		for i := 0; i < len(c); i += 2 {
			h = h.Entry(c[i], c[i+1])
			b = AppendEntry(b, i/2, c[i], c[i+1])
		}
		if prev, ok := seen[h]; ok {
			t.Errorf("%q and %s hash alike", c, prev)
		}
		seen[h] = fmt.Sprintf("%q", c)
		if len(c) == 4 && string(b) != c[0]+"="+c[1]+"/"+c[2]+"="+c[3] {
			t.Errorf("%q written %q", c, b)
		}
	}
}

// TestSeries: each 10 s of the last 10 minutes counts its own outcomes,
// the current one and those before it, and 10 s that fall out of the
// 10 minutes (or had nothing) read zero.
func TestSeries(t *testing.T) {
	start := time.Unix(1_800_000_000, 0) // a multiple of 10 s
	now := start
	tr := New(Config{Now: func() time.Time { return now }})
	add := func(o Outcome, n int) {
		for range n {
			tr.Add("r", 1, o, name("k"))
		}
	}
	add(Allowed, 3)
	add(Denied, 2)
	now = start.Add(10 * time.Second)
	add(ShadowDenied, 4)
	now = start.Add(35 * time.Second)
	add(Allowed, 1)
	check := func(want map[int64][3]int64) {
		t.Helper()
		ps := tr.Series("r")
		if len(ps) != SeriesLen {
			t.Fatalf("%d points, want %d", len(ps), SeriesLen)
		}
		for i, p := range ps {
			if i > 0 && p.At != ps[i-1].At+10 {
				t.Fatalf("point %d at %d after %d", i, p.At, ps[i-1].At)
			}
			got := [3]int64{p.Allowed, p.Denied, p.Shadow}
			if got != want[p.At] {
				t.Errorf("at +%d s: %v, want %v", p.At-start.Unix(), got, want[p.At])
			}
		}
		if last := ps[len(ps)-1].At; last != now.Unix()/10*10 {
			t.Errorf("the last point is at %d, want %d", last, now.Unix()/10*10)
		}
	}
	s := start.Unix()
	check(map[int64][3]int64{s: {3, 2, 0}, s + 10: {0, 0, 4}, s + 30: {1, 0, 0}})
	// Nine minutes on, the first 10 s are still in; ten, they are out.
	now = start.Add(9*time.Minute + 55*time.Second)
	add(Denied, 1)
	check(map[int64][3]int64{s: {3, 2, 0}, s + 10: {0, 0, 4}, s + 30: {1, 0, 0}, s + 590: {0, 1, 0}})
	now = start.Add(10*time.Minute + 5*time.Second)
	check(map[int64][3]int64{s + 10: {0, 0, 4}, s + 30: {1, 0, 0}, s + 590: {0, 1, 0}})
	// The same place in the ring, ten minutes later, starts from zero.
	now = start.Add(10*time.Minute + 35*time.Second)
	add(Allowed, 2)
	check(map[int64][3]int64{s + 590: {0, 1, 0}, s + 630: {2, 0, 0}})
}

// TestRuleLookup: a rule is found by its name whatever string holds it
// (the table of recent names is checked by comparing names), with more
// rules than that table has slots, so that they share slots.
func TestRuleLookup(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	tr := New(Config{Now: func() time.Time { return now }})
	const rules = 3 * recentSlots / 2
	names := make([]string, rules)
	for i := range names {
		names[i] = fmt.Sprint("rule.", i)
	}
	for round := range 5 {
		for i, n := range names {
			for range i + 1 {
				tr.Add(n, 1, Allowed, name("k"))
			}
			if round%2 == 1 { // the same name, in other bytes
				tr.Add(strings.Clone(n), 1, Allowed, name("k"))
			}
		}
	}
	for i, n := range names {
		if _, total := tr.Top(n, Requests, false, 1); total != uint64(5*(i+1)+2) {
			t.Errorf("%s: %d hits, want %d", n, total, 5*(i+1)+2)
		}
	}
}

// TestSeriesLateHits: a hit that read the clock before another hit
// moved the series on (or under a clock set back) counts in its own 10 s,
// which stays counted; one older than the 10 minutes is dropped.
func TestSeriesLateHits(t *testing.T) {
	start := time.Unix(1_800_000_000, 0)
	now := start
	tr := New(Config{Now: func() time.Time { return now }})
	at := func(d time.Duration, o Outcome, n int) {
		now = start.Add(d)
		for range n {
			tr.Add("r", 1, o, name("k"))
		}
	}
	at(0, Allowed, 50)
	at(10*time.Second, Allowed, 5)
	at(9*time.Second, Denied, 1) // late
	at(11*time.Second, Allowed, 1)
	at(25*time.Second, Allowed, 2)     // 20 s had nothing before
	at(8*time.Second, ShadowDenied, 3) // a clock set back
	at(21*time.Second, Denied, 1)      // late, to a 10 s the ring is still on
	at(31*time.Second, Allowed, 1)     // and on
	at(-11*time.Minute, Allowed, 7)    // older than the 10 minutes
	at(31*time.Second, Allowed, 0)
	s := start.Unix()
	want := map[int64][3]int64{s: {50, 1, 3}, s + 10: {6, 0, 0}, s + 20: {2, 1, 0}, s + 30: {1, 0, 0}}
	for _, p := range tr.Series("r") {
		if got := [3]int64{p.Allowed, p.Denied, p.Shadow}; got != want[p.At] {
			t.Errorf("at +%d s: %v, want %v", p.At-s, got, want[p.At])
		}
	}
}

// TestFilterHeldCount: a filter cell counts the keys held in it exactly
// while fewer than 15, and says 15 for more; with 20 keys of one cell
// held, then evicted one by one by a flood of others, it is right after
// every hit (the count of 15 or more is recounted when it falls).
func TestFilterHeldCount(t *testing.T) {
	s := newSummary(32)
	rng := rand.New(rand.NewPCG(8, 9))
	var same, others []uint64
	for len(same) < 20 || len(others) < 2000 {
		h := rng.Uint64()
		if s.cell(h) == 7 {
			if len(same) < 20 {
				same = append(same, h)
			}
		} else if len(others) < 2000 {
			others = append(others, h)
		}
	}
	check := func(step string) {
		t.Helper()
		n := 0
		for _, c := range s.cnt {
			if s.cell(c.hash) == 7 {
				n++
			}
		}
		if got := int(s.alpha[7] >> cellShift); got != min(n, cellHeldMax) {
			t.Fatalf("%s: cell 7 counts %d keys held, holds %d", step, got, n)
		}
	}
	for round := range 3 {
		for i, h := range same {
			s.hit(h, name(fmt.Sprint("same", i)))
			check(fmt.Sprint("round ", round, ", key ", i))
		}
	}
	peak := 0
	for i := range 40_000 {
		s.hit(others[rng.IntN(len(others))], name("other"))
		n := 0
		for _, c := range s.cnt {
			if s.cell(c.hash) == 7 {
				n++
			}
		}
		peak = max(peak, n)
		check(fmt.Sprint("flood hit ", i))
		if n == 0 {
			break
		}
	}
	if peak < 16 {
		t.Fatalf("at most %d keys of the cell held: the test tests nothing", peak)
	}
}

// TestNoRuleName: a hit without a rule name (a remote decider names none)
// is not kept under a rule named "".
func TestNoRuleName(t *testing.T) {
	tr := New(Config{})
	defer tr.Close()
	tr.Add("", 1, Denied, name("k"))
	if rules := tr.Rules(); len(rules) != 0 {
		t.Errorf("rules %q, want none", rules)
	}
}

// TestEntries: a "%" that escapes nothing (as a key written before
// escaping may hold) reads as itself; an escape reads as its byte.
func TestEntries(t *testing.T) {
	for key, want := range map[string][][2]string{
		"a=50%/b=%zz/c=%4": {{"a", "50%"}, {"b", "%zz"}, {"c", "%4"}},
		"p=%2Fv1%2fx%3D":   {{"p", "/v1/x="}},
		"k":                {{"k", ""}},
	} {
		if got := Entries(key); !slices.Equal(got, want) {
			t.Errorf("Entries(%q) = %q, want %q", key, got, want)
		}
	}
}
