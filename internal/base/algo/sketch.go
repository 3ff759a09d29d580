package algo

import (
	"encoding/binary"
	"errors"
	"math"
	"math/bits"
	"unsafe"
)

// CMSketch, the state of the Sketch algorithm, is a count-min sketch over
// two epoch-aligned windows (the current and the previous one) shared by all
// keys of one limit, so that its memory is constant whatever the number of
// keys. It decides a key like the sliding
// window counter (see [Step] with SlidingWindow), with the key's counts in
// both windows replaced by their sketch estimates.
//
// Each window is depth rows of width saturating uint32 counters. A key,
// given as a 64-bit hash, maps to one counter per row, through an
// independent mix of the hash per row. Hits are added with the conservative
// update: each of the key's counters is raised to (its current estimate + n)
// if it is below that, which keeps every counter at least the true count of
// every key mapped to it. The estimate of a key is the minimum over its
// counters, so it never under-estimates, and the sketch never admits a
// request that the exact sliding window counter, fed the same admitted
// requests, would deny. Keys that share counters in every row look busier
// than they are; that is the price of constant memory.
//
// Accuracy: with width w = ⌈e/ε⌉ and depth d = ⌈ln(1/δ)⌉, a key's estimate in
// one window exceeds its true count by more than ε·N, N being the total hits
// of all keys in that window, with probability at most δ. For example
// 2048×4 (64 KiB for both windows) gives ε ≈ 0.13% and δ ≈ 1.8%.
//
// Windows rotate on the first Check or Add in a new window. Time going
// backwards never rotates back: the request is counted in the current
// window as if it came at its start. A Check with a different Period than
// the previous one clears the sketch.
//
// A CMSketch is not safe for concurrent use; the store serializes Check and
// Add (the pair must be atomic per limit for the limit to hold).
type CMSketch struct {
	width, depth int
	period       int64 // of the windows; 0 until the first Check
	start        int64 // of the current window
	cur, prev    []uint32
}

// NewSketch returns an empty sketch of depth rows of width counters per
// window. Width and depth below 1 are taken as 1.
func NewSketch(width, depth int) *CMSketch {
	width, depth = max(width, 1), max(depth, 1)
	cells := width * depth
	buf := make([]uint32, 2*cells)
	return &CMSketch{
		width: width,
		depth: depth,
		cur:   buf[:cells:cells],
		prev:  buf[cells:],
	}
}

// Width returns the number of counters per row.
func (s *CMSketch) Width() int { return s.width }

// Depth returns the number of rows.
func (s *CMSketch) Depth() int { return s.depth }

// Bytes returns the memory the sketch uses: both windows' counters plus the
// CMSketch itself.
func (s *CMSketch) Bytes() int {
	return int(unsafe.Sizeof(*s)) + 4*(len(s.cur)+len(s.prev))
}

// rotate moves the windows forward to the one holding now and returns the
// evaluation window: its start and the time elapsed in it (0 when the clock
// went backwards).
func (s *CMSketch) rotate(period, now int64) (ws, e int64) {
	ws = alignDown(now, period)
	if s.period != period {
		clear(s.cur)
		clear(s.prev)
		s.period, s.start = period, ws
	}
	switch {
	case ws == s.start:
	case ws < s.start:
		return s.start, 0
	case ws-s.start == period:
		s.cur, s.prev = s.prev, s.cur
		clear(s.cur)
		s.start = ws
	default:
		clear(s.cur)
		clear(s.prev)
		s.start = ws
	}
	return ws, now - ws
}

// cell returns the index of the key's counter in the given row.
func (s *CMSketch) cell(h uint64, row int) int { return cellIndex(h, row, s.width) }

// SketchCells appends to dst, for each of the depth rows, the index
// row*width + column of the counter that a CMSketch of that width and depth
// uses for the key with hash h, and returns the extended slice: how a store
// that keeps the counters itself (in Redis, say) addresses the same
// counters. Width and depth below 1 are taken as 1, as by NewSketch.
func SketchCells(h uint64, width, depth int, dst []uint32) []uint32 {
	width, depth = max(width, 1), max(depth, 1)
	for row := range depth {
		dst = append(dst, uint32(cellIndex(h, row, width)))
	}
	return dst
}

// cellIndex is the one definition of a key's counter in a row, for cell
// and SketchCells.
func cellIndex(h uint64, row, width int) int {
	x := mix64(h + uint64(row+1)*0x9e3779b97f4a7c15)
	i, _ := bits.Mul64(x, uint64(width)) // uniform in [0, width)
	return row*width + int(i)
}

// mix64 is the finalizer of SplitMix64: a bijection of uint64 with good
// avalanche, so that rows derived from one hash are nearly independent.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// estimate returns the minimum of the key's counters in w.
func (s *CMSketch) estimate(w []uint32, h uint64) uint64 {
	est := uint32(math.MaxUint32)
	for row := range s.depth {
		est = min(est, w[s.cell(h, row)])
	}
	return uint64(est)
}

// Check evaluates a request of cost n for the key with hash h at time now,
// with the semantics of the sliding window counter (Capacity at most
// MaxSlidingWindowCapacity) on the key's estimated counts. It rotates the
// windows when now is in a new one but counts nothing: call Add after an
// allowed request. RetryAfter assumes no other key adds to the key's
// counters meanwhile.
func (s *CMSketch) Check(p *Params, h uint64, now, n int64) Result {
	return s.check(p, h, now, n, false)
}

// CheckEach is Check for a hit decided on its own (see Overdraw): a peek
// at a key whose estimate is above the capacity, a debt, is denied until
// the estimate is back within it.
func (s *CMSketch) CheckEach(p *Params, h uint64, now, n int64) Result {
	return s.check(p, h, now, n, true)
}

func (s *CMSketch) check(p *Params, h uint64, now, n int64, debt bool) Result {
	if n < 0 {
		n = 0
	}
	now = clampNow(now)
	if p.Period <= 0 || p.Rate < 0 || p.Capacity < 0 {
		return zeroLimit(n, 0)
	}
	ws, e := s.rotate(p.Period, now)
	w := slide{ws: ws, e: e, prev: s.estimate(s.prev, h), curr: s.estimate(s.cur, h)}
	if p.Rate == 0 {
		return zeroLimit(n, w.end(p.Period)-now)
	}
	return w.result(p.Period, min(p.Capacity, MaxSlidingWindowCapacity), now, n, debt)
}

// Add counts n hits for the key with hash h in the window holding now (or
// in the current window if now is earlier), with the conservative update.
// Counters saturate at math.MaxUint32, which is above any capacity, so a
// saturated counter denies.
func (s *CMSketch) Add(h uint64, now, n int64) {
	if n <= 0 {
		return
	}
	if s.period > 0 {
		s.rotate(s.period, clampNow(now))
	}
	target := uint32(min(s.estimate(s.cur, h)+uint64(min(n, math.MaxUint32)), math.MaxUint32))
	for row := range s.depth {
		i := s.cell(h, row)
		s.cur[i] = max(s.cur[i], target)
	}
}

// sketchMagic starts a marshalled CMSketch, with the format version.
const sketchMagic = "sluice-cms-1\n"

const sketchHeader = len(sketchMagic) + 4 + 4 + 8 + 8

// MarshalBinary encodes the sketch, both windows included, for a snapshot.
func (s *CMSketch) MarshalBinary() ([]byte, error) {
	b := make([]byte, 0, sketchHeader+4*(len(s.cur)+len(s.prev)))
	b = append(b, sketchMagic...)
	b = binary.LittleEndian.AppendUint32(b, uint32(s.width))
	b = binary.LittleEndian.AppendUint32(b, uint32(s.depth))
	b = binary.LittleEndian.AppendUint64(b, uint64(s.period))
	b = binary.LittleEndian.AppendUint64(b, uint64(s.start))
	for _, c := range s.cur {
		b = binary.LittleEndian.AppendUint32(b, c)
	}
	for _, c := range s.prev {
		b = binary.LittleEndian.AppendUint32(b, c)
	}
	return b, nil
}

// UnmarshalBinary replaces s with a sketch encoded by MarshalBinary,
// dimensions included. On error s is unchanged.
func (s *CMSketch) UnmarshalBinary(data []byte) error {
	if len(data) < sketchHeader || string(data[:len(sketchMagic)]) != sketchMagic {
		return errors.New("algo: not a marshalled sketch")
	}
	d := data[len(sketchMagic):]
	width := uint64(binary.LittleEndian.Uint32(d))
	depth := uint64(binary.LittleEndian.Uint32(d[4:]))
	period := int64(binary.LittleEndian.Uint64(d[8:]))
	start := int64(binary.LittleEndian.Uint64(d[16:]))
	d = d[24:]
	cells := width * depth // < 2^64: both are 32-bit
	if width == 0 || depth == 0 || cells > math.MaxInt32 || uint64(len(d)) != 8*cells {
		return errors.New("algo: marshalled sketch has the wrong size")
	}
	if period < 0 || start < 0 {
		return errors.New("algo: marshalled sketch has a negative time")
	}
	t := NewSketch(int(width), int(depth))
	for i := range t.cur {
		t.cur[i] = binary.LittleEndian.Uint32(d[4*i:])
	}
	d = d[4*len(t.cur):]
	for i := range t.prev {
		t.prev[i] = binary.LittleEndian.Uint32(d[4*i:])
	}
	t.period, t.start = period, start
	*s = *t
	return nil
}
