package hitters

import (
	"cmp"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// Windows and their slices: the minute is 6 summaries of 10 s, each fed
// every hit of its slice; the hour is 12 merged summaries of 5 minutes,
// into which each 10 s summary is folded when its slice ends (fold.go),
// and the current 10 s summary. A read adds up what its window holds.
const (
	slice     = 10 * time.Second
	minuteLen = 6
	hourSlice = 5 * time.Minute
	hourLen   = 12
)

// Kind is what a summary counts.
type Kind uint8

const (
	Requests Kind = iota // every request of the rule's descriptors
	Denials              // those its limits denied
	numKinds
)

// Config configures a Tracker; zero fields take their defaults.
type Config struct {
	// Counters is m, the counters of each summary (64 when zero): every
	// key with more than 1/m of a window's hits is held.
	Counters int
	// MaxRules bounds the rules tracked (100 when zero); hits of more
	// rules are counted in Untracked. Each rule tracked holds 2 kinds ×
	// 18 summaries × Counters counters, and 16 filter cells per counter
	// in the 6 fed ones: 390 KB with 64 counters (TestRuleMemory), so
	// 39 MB for 100 rules.
	MaxRules int
	// Now is the clock. Nil means a coarse clock: the time read every
	// 100 ms by a goroutine of the Tracker (until Close), because reading
	// the time costs more than the rest of Add on some machines (measured
	// here on 2026-11-26: time.Now made Add 63 ns against 20), and slices
	// of 10 s need no better.
	Now func() time.Time
}

// Tracker keeps the heavy hitters of every rule. It is safe for
// concurrent use; its memory is bounded by MaxRules × 2 kinds × 18
// summaries × Counters counters (about 210 bytes each in the 6 fed
// summaries, with the index, the heap and 16 filter cells, and 145 in
// the 12 merged ones) whatever the keys.
type Tracker struct {
	cfg    Config
	coarse atomic.Int64                          // unix nanoseconds, with a nil Config.Now
	mu     sync.Mutex                            // for adding rules
	rules  atomic.Pointer[map[string]*ruleTrack] // copied on every new rule, read without a lock

	// recent finds a rule's track by where its name's bytes are, before
	// the map (which hashes them): the callers' rule names are mostly
	// the same few strings of a compiled config. A slot is checked by
	// comparing names, so a stale or colliding slot costs a map lookup.
	recent [recentSlots]atomic.Pointer[ruleTrack]

	// Untracked counts hits of rules beyond MaxRules.
	Untracked atomic.Int64

	stop      chan struct{}
	closeOnce sync.Once
}

// recentSlots is the size of Tracker.recent.
const (
	recentBits  = 6
	recentSlots = 1 << recentBits
)

// ruleTrack is one rule's summaries and series, in one allocation, so that
// a hit reaches its summary by offsets from the rule, not by a chain of
// pointers, each a load to wait for.
type ruleTrack struct {
	name   string
	mu     sync.Mutex
	now    seriesBucket // the series' current 10 s, beside the lock
	kinds  [numKinds]windows
	series [SeriesLen]seriesBucket // the 10 s before
}

// windows is the minute's and the hour's summaries of one rule and kind.
type windows struct {
	cur       int64 // the 10 s slice the minute's last summary is for
	curHour   int64 // the 5 min slice the hour's last summary is for
	minuteIdx int
	hourIdx   int
	minute    [minuteLen]summary
	hour      [hourLen]summary
	scratch   foldScratch
}

// New returns a Tracker.
func New(cfg Config) *Tracker {
	if cfg.Counters <= 0 {
		cfg.Counters = 64
	}
	if cfg.MaxRules <= 0 {
		cfg.MaxRules = 100
	}
	t := &Tracker{cfg: cfg}
	t.rules.Store(&map[string]*ruleTrack{})
	if cfg.Now == nil {
		t.coarse.Store(time.Now().UnixNano())
		stop := make(chan struct{})
		t.stop = stop
		go func() {
			tick := time.NewTicker(100 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case now := <-tick.C:
					t.coarse.Store(now.UnixNano())
				}
			}
		}()
	}
	return t
}

// Close stops the coarse clock's goroutine (with a nil Config.Now).
func (t *Tracker) Close() {
	if t.stop != nil {
		t.closeOnce.Do(func() { close(t.stop) })
	}
}

// Now returns the tracker's clock: the coarse one (100 ms) with a nil
// Config.Now.
func (t *Tracker) Now() time.Time { return time.Unix(0, t.now()) }

// now is the tracker's time, in unix nanoseconds.
func (t *Tracker) now() int64 {
	if t.cfg.Now != nil {
		return t.cfg.Now().UnixNano()
	}
	return t.coarse.Load()
}

// init makes w's summaries, for the slices of now.
func (w *windows) init(m int, now int64) {
	w.cur, w.curHour = now/int64(slice), now/int64(hourSlice)
	for i := range w.minute {
		w.minute[i].init(m)
	}
	for i := range w.hour {
		w.hour[i].initMerged(m)
	}
}

// advance moves w to the 10 s slice sl and the 5-minute slice hs: the
// summary of the slice that ends is folded into its 5 minutes (the hour's
// current part: both move together), and summaries that leave their
// window are emptied for reuse.
func (w *windows) advance(sl, hs int64) {
	if w.cur < sl {
		w.hour[w.hourIdx].fold(&w.minute[w.minuteIdx], &w.scratch)
		if sl-w.cur >= minuteLen {
			for i := range w.minute {
				w.minute[i].reset()
			}
		} else {
			for w.cur < sl {
				w.cur++
				w.minuteIdx = (w.minuteIdx + 1) % minuteLen
				w.minute[w.minuteIdx].reset()
			}
		}
		w.cur = sl
		w.rollHour(hs) // a 5-minute slice is a whole number of 10 s ones
	}
}

// rollHour moves the hour's current summary to the 5-minute slice hs.
func (w *windows) rollHour(hs int64) {
	if hs-w.curHour >= hourLen {
		for i := range w.hour {
			w.hour[i].reset()
		}
		w.curHour = hs
		return
	}
	for w.curHour < hs {
		w.curHour++
		w.hourIdx = (w.hourIdx + 1) % hourLen
		w.hour[w.hourIdx].reset()
	}
}

// Add records one request of rule with the key whose hash is h, and its
// outcome; name writes the key's text, and is called only when the key
// takes a counter. It allocates nothing once the rule is tracked. A hit
// without a rule name (a remote decider names none) is not kept.
func (t *Tracker) Add(rule string, h uint64, o Outcome, name func([]byte) []byte) {
	r := t.lookup(rule)
	if r == nil {
		if rule == "" {
			return
		}
		if r = t.track(rule); r == nil {
			t.Untracked.Add(1)
			return
		}
	}
	r.mu.Lock()
	sl := r.at(t.now())
	r.countAt(sl, o)
	w := &r.kinds[Requests]
	w.minute[w.minuteIdx].hit(h, name)
	if o == Denied {
		w = &r.kinds[Denials]
		w.minute[w.minuteIdx].hit(h, name)
	}
	r.mu.Unlock()
}

// at returns the 10 s slice of now (unix nanoseconds), having moved r
// forward to it if it is later than r's: the series' current 10 s and
// both kinds' windows together, so that a late hit goes to the same slice
// of each; r.mu is held. A hit checks one number to know it need not.
func (r *ruleTrack) at(now int64) int64 {
	sl := now / int64(slice)
	if sl > r.now.slot {
		r.rollSeries(now)
		for k := range r.kinds {
			r.kinds[k].advance(sl, now/int64(hourSlice))
		}
	}
	return sl
}

// lookup returns rule's track, nil if it is not tracked.
func (t *Tracker) lookup(rule string) *ruleTrack {
	at := uint64(uintptr(unsafe.Pointer(unsafe.StringData(rule))))
	slot := &t.recent[(at*0x9E3779B97F4A7C15)>>(64-recentBits)]
	if r := slot.Load(); r != nil && (unsafe.StringData(r.name) == unsafe.StringData(rule) && len(r.name) == len(rule) || r.name == rule) {
		return r
	}
	r := (*t.rules.Load())[rule]
	if r != nil {
		slot.Store(r)
	}
	return r
}

// track adds rule, nil beyond MaxRules.
func (t *Tracker) track(rule string) *ruleTrack {
	t.mu.Lock()
	defer t.mu.Unlock()
	old := *t.rules.Load()
	if r := old[rule]; r != nil {
		return r
	}
	if len(old) >= t.cfg.MaxRules {
		return nil
	}
	now := t.now()
	r := &ruleTrack{name: rule}
	for k := range r.kinds {
		r.kinds[k].init(t.cfg.Counters, now)
	}
	m := maps.Clone(old)
	m[rule] = r
	t.rules.Store(&m)
	return r
}

// Item is one key of a top list. Its true count in the window is between
// Low and High.
type Item struct {
	Key       string `json:"key"`
	High      uint64 `json:"count"`
	Low       uint64 `json:"count_low"`
	Truncated bool   `json:"truncated,omitempty"` // the key is longer than shown

	// InFlight is, for a key of a rule with a concurrency limit, the
	// permits it holds now and InFlightMax the most it may: read from
	// the store when the list is shown (topkeys.InFlight), never counted
	// here nor shared with other nodes. Nil for a rate's key, and when
	// the store did not answer.
	InFlight    *int64 `json:"in_flight,omitempty"`
	InFlightMax int64  `json:"in_flight_max,omitempty"`
}

// Top is the k keys of rule with the highest counts in the last minute
// (hour false) or hour, and the window's hits.
func (t *Tracker) Top(rule string, kind Kind, hour bool, k int) ([]Item, uint64) {
	r := (*t.rules.Load())[rule]
	if r == nil || kind >= numKinds {
		return nil, 0
	}
	r.mu.Lock()
	r.at(t.now())
	w := &r.kinds[kind]
	var parts []*summary
	if hour {
		// The 5-minute parts, and the 10 s not folded in yet.
		for i := range w.hour {
			parts = append(parts, &w.hour[i])
		}
		parts = append(parts, &w.minute[w.minuteIdx])
	} else {
		for i := range w.minute {
			parts = append(parts, &w.minute[i])
		}
	}
	type acc struct {
		item Item
		hash uint64
	}
	byHash := map[uint64]*acc{}
	var total uint64
	for _, s := range parts {
		total += s.total
		for i := range s.cnt {
			c := &s.cnt[i]
			a := byHash[c.hash]
			if a == nil {
				key := string(s.keys[i][:c.klen])
				a = &acc{hash: c.hash, item: Item{Key: key, Truncated: c.klen == MaxKeyLen && strings.HasSuffix(key, "…")}}
				byHash[c.hash] = a
			}
			low, high := s.interval(i)
			a.item.High += high
			a.item.Low += low
		}
	}
	// Where a key is not held, it may have had up to its filter cell
	// there, or a merged summary's delta.
	for _, a := range byHash {
		for _, s := range parts {
			if s.find(a.hash) < 0 {
				a.item.High += s.bound(a.hash)
			}
		}
	}
	r.mu.Unlock()
	items := make([]Item, 0, len(byHash))
	for _, a := range byHash {
		items = append(items, a.item)
	}
	slices.SortFunc(items, func(a, b Item) int {
		if c := cmp.Compare(b.High, a.High); c != 0 {
			return c
		}
		return strings.Compare(a.Key, b.Key)
	})
	if len(items) > k {
		items = items[:k]
	}
	return items, total
}

// Rules lists the rules tracked.
func (t *Tracker) Rules() []string {
	rules := *t.rules.Load()
	out := make([]string, 0, len(rules))
	for r := range rules {
		out = append(out, r)
	}
	slices.Sort(out)
	return out
}
