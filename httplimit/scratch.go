package httplimit

import (
	"net/http"
	"net/netip"
	"unsafe"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/decision/ratelimitheaders"
	"github.com/sluicehq/sluice/rules"
)

// scratch is the per-request state, pooled: the requests' descriptors
// and entries, the outcome, and buffers.
type scratch struct {
	main    reqScratch // Config.Descriptors
	fail    reqScratch // Failures.Descriptors
	req     decide.Request
	out     decide.Outcome
	client  string     // the resolved client key, when needed
	addr    netip.Addr // the resolved client address, ungrouped, when needed
	key     []byte
	ckey    []byte // the concurrency or queue key
	hdr     ratelimitheaders.Values
	entries []rules.Entry // all of main's and fail's
	tokens  int           // the index in main of the token descriptor; -1: none
	flow    flow          // the request on its way through the pipeline
}

// reqScratch is the descriptors of one decision with their storage.
type reqScratch struct {
	next    int // the next free entry
	descs   []rules.Descriptor
	entries []rules.Entry
}

// newScratch makes the scratch of one request, sized for the descriptors
// of m.
func (m *middleware) newScratch() *scratch {
	// The main request holds Config.Descriptors and, as peeks, the
	// failure descriptors; s.fail holds the failure descriptors alone.
	descs, fails := len(m.descs), 0
	if m.tokens != nil {
		descs++
	}
	if m.failures != nil {
		descs += len(m.failures.descs)
		for _, d := range m.failures.descs {
			fails += len(d)
		}
	}
	s := &scratch{
		tokens:  -1,
		key:     make([]byte, 0, 64),
		hdr:     ratelimitheaders.Values{Buf: make([]byte, 0, 256)},
		entries: make([]rules.Entry, m.entries+fails),
	}
	s.main.init(descs, s.entries[:m.entries])
	s.fail.init(descs-len(m.descs), s.entries[m.entries:])
	return s
}

// init makes rs room for descs descriptors over entries.
func (rs *reqScratch) init(descs int, entries []rules.Entry) {
	rs.descs = make([]rules.Descriptor, 0, descs)
	rs.entries = entries
}

// release empties s of the request's values and returns it to the pool.
func (m *middleware) release(s *scratch) {
	for i := range s.entries {
		s.entries[i].Value = ""
	}
	s.main.reset()
	s.fail.reset()
	s.client = ""
	s.addr = netip.Addr{}
	s.tokens = -1
	s.flow = flow{}
	s.out.Reset()
	m.scratch.Put(s)
}

// build resolves the client when a descriptor needs it and fills s.main
// with the descriptors of r; it returns how many there are: 0 when every
// descriptor is skipped.
func (m *middleware) build(s *scratch, r *http.Request) (int, error) {
	if m.needIP {
		a, bits, err := m.ip.resolve(r)
		if err != nil {
			return 0, err
		}
		p, _ := a.Prefix(bits) // bits is in range for a's family
		s.addr = a
		s.key = appendKey(s.key[:0], p)
		// The client key lives in s.key until the request is done: no
		// copy per request (see Decider, and concurrency.acquire, which
		// copies it to keep it).
		s.client = unsafe.String(unsafe.SliceData(s.key), len(s.key))
	}
	s.main.reset()
	return m.fill(&s.main, m.descs, r, s, 1)
}

// reset empties rs of descriptors.
func (rs *reqScratch) reset() {
	clear(rs.descs)
	rs.descs = rs.descs[:0]
	rs.next = 0
}

// appendCopy adds to rs copies of the descriptors of src, with their
// costs: the values already taken from the request, not again.
func (rs *reqScratch) appendCopy(src *reqScratch) {
	for _, sd := range src.descs {
		start := rs.next
		for _, e := range sd.Entries {
			rs.entries[rs.next] = e
			rs.next++
		}
		rs.descs = append(rs.descs, rules.Descriptor{Entries: rs.entries[start:rs.next:rs.next], Cost: sd.Cost})
	}
}

// fill adds to rs the descriptors set of r, each of cost hits, and returns
// how many it added.
func (m *middleware) fill(rs *reqScratch, set [][]entry, r *http.Request, s *scratch, hits int64) (int, error) {
	before := len(rs.descs)
	next := rs.next
descs:
	for _, d := range set {
		start := next
		for i := range d {
			e := &d[i]
			v, ok, err := e.value(r, s)
			if err != nil {
				return 0, invalidError{err.Error()}
			}
			if !ok {
				for j := start; j < next; j++ {
					rs.entries[j].Value = ""
				}
				next = start
				continue descs
			}
			rs.entries[next] = rules.Entry{Key: e.key, Value: v}
			next++
		}
		rs.descs = append(rs.descs, rules.Descriptor{Entries: rs.entries[start:next:next], Cost: hits})
	}
	rs.next = next
	return len(rs.descs) - before, nil
}
