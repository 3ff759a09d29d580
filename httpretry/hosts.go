package httpretry

import (
	"sync"
	"sync/atomic"

	"github.com/sluicehq/sluice/internal/base/algo"
)

// host is what the transport knows of one host (one Config.Key): until
// when its quota is spent, its pacing bucket, and its retry budget's
// counts. Times are Unix nanoseconds.
type host struct {
	mu     sync.Mutex
	hold   int64      // the host's quota is spent until then
	bucket algo.State // pacing: a token bucket, evaluated by algo.Step
	win    window     // the adaptive retry budget's counts
}

// idle reports whether h holds nothing that matters at now, so that
// forgetting it changes nothing. h.mu must be held.
func (h *host) idle(now, width int64) bool {
	req, _ := h.win.sums(now, width)
	return h.hold <= now && h.bucket.A <= now && req == 0
}

// hostMap holds the state of at most max hosts.
type hostMap struct {
	mu  sync.RWMutex
	m   map[string]*host
	n   atomic.Int64 // len(m), read without the lock
	max int
}

// get returns the state of key, or nil when there is none. While no host
// has any state (no quota was ever announced spent) it is one atomic load.
func (hm *hostMap) get(key string) *host {
	if hm.n.Load() == 0 {
		return nil
	}
	hm.mu.RLock()
	h := hm.m[key]
	hm.mu.RUnlock()
	return h
}

// getOrCreate returns the state of key, making it when there is none.
// When the map is full it first forgets the idle hosts; when none is idle
// it forgets one host at random (Go's map order), whose state is lost: a
// later request to that host is neither held nor paced by what came before.
// width is the budget's slot width, to tell idle windows.
func (hm *hostMap) getOrCreate(key string, now, width int64) *host {
	if h := hm.get(key); h != nil {
		return h
	}
	hm.mu.Lock()
	defer hm.mu.Unlock()
	defer func() { hm.n.Store(int64(len(hm.m))) }()
	if h := hm.m[key]; h != nil {
		return h
	}
	if hm.m == nil {
		hm.m = make(map[string]*host)
	}
	if len(hm.m) >= hm.max {
		for k, h := range hm.m {
			h.mu.Lock()
			idle := h.idle(now, width)
			h.mu.Unlock()
			if idle {
				delete(hm.m, k)
			}
		}
		for k := range hm.m {
			if len(hm.m) < hm.max {
				break
			}
			delete(hm.m, k)
		}
	}
	h := new(host)
	hm.m[key] = h
	return h
}

// len returns the number of hosts held.
func (hm *hostMap) len() int {
	hm.mu.RLock()
	defer hm.mu.RUnlock()
	return len(hm.m)
}

// budgetSlots is the number of steps of the budget's sliding window.
const budgetSlots = 12

// window counts requests and accepts over the last budgetSlots slots of
// a given width: a sliding window that moves in steps of one slot.
type window [budgetSlots]struct {
	at       int64 // slot number plus one; 0 is an empty slot
	req, acc int64
}

func slotOf(now, width int64) int64 {
	if now < 0 {
		now = 0
	}
	return now/width + 1
}

// add counts req requests and acc accepts at now.
func (w *window) add(now, width, req, acc int64) {
	n := slotOf(now, width)
	s := &w[n%budgetSlots]
	if s.at != n {
		s.at, s.req, s.acc = n, 0, 0
	}
	s.req += req
	s.acc += acc
}

// sums returns the requests and accepts counted in the window that ends
// at now.
func (w *window) sums(now, width int64) (req, acc int64) {
	n := slotOf(now, width)
	for i := range w {
		if s := &w[i]; s.at > n-budgetSlots && s.at <= n {
			req += s.req
			acc += s.acc
		}
	}
	return req, acc
}
