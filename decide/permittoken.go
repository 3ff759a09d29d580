package decide

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/vocab/permitfunc"
	"github.com/sluicehq/sluice/rules"
)

// A permit token names the permits one request holds, for a front door
// that cannot keep the request's Permit until the request ends: sluice
// serve hands it to Envoy in its answer, and Envoy sends it back when the
// stream is done, in a descriptor of the same entries (Request.Release).
//
//	token = where item{1,64}
//	where = "s"               held in the store
//	      | "l" nodes "."     held in the node's own store by the local
//	                          failure policy, as shares of nodes nodes
//	                          (decimal, 1 to 2^20: with more, no key has
//	                          a slot to share)
//	item  = tag id            34 bytes
//	tag   = 8 hex digits      FNV-1a, 32 bits, of the permit's counter key
//	                          (lower case)
//	id    = 26 of A-Z, 2-7    the permit's ID (crypto/rand.Text)
//
// The ID is the capability: 128 random bits that only the holder is
// shown. A token names no key: a release acts on the keys that its
// descriptor's own entries plan, each ID on the key whose tag it carries
// (a tag that two keys share costs a release that changes nothing), so a
// token replayed with other entries, forged, or sent after its permits
// expired releases nothing another holds. A request holds at most
// sluice.MaxHits permits, so a token is at most 2,185 bytes; a release
// gives back at most MaxHits permits, whatever its descriptors and tokens
// say.
const (
	tagLen   = 8
	idLen    = 26
	itemLen  = tagLen + idLen
	maxNodes = 1 << 20
	maxToken = len("l1048576.") + sluice.MaxHits*itemLen
)

// permitToken is the token of the permits that held hold (the hits of
// Concurrency limits of cost 1 with a permit ID), tagged with the keys of
// the plan's hits of the same index, keys. nodes is 0 for permits held in
// the store, else the node count of the local policy's shares.
func permitToken(keys, held []sluice.Hit, nodes int64) string {
	var buf [8 + 2*itemLen]byte
	b := buf[:0]
	if nodes == 0 {
		b = append(b, 's')
	} else {
		b = append(b, 'l')
		b = strconv.AppendInt(b, nodes, 10)
		b = append(b, '.')
	}
	for i := range held {
		h := &held[i]
		if h.Permit == "" || h.Cost != 1 || h.Limit == nil || h.Limit.Algorithm != sluice.Concurrency {
			continue
		}
		b = appendTag(b, keys[i].Key)
		b = append(b, h.Permit...)
	}
	return string(b)
}

// appendTag appends the tag of key: its FNV-1a hash, 32 bits, in 8 lower
// case hex digits.
func appendTag(b []byte, key string) []byte {
	h := keyTag(key)
	const hex = "0123456789abcdef"
	for shift := 28; shift >= 0; shift -= 4 {
		b = append(b, hex[h>>uint(shift)&0xf])
	}
	return b
}

// token is a parsed permit token: where its permits are held, and its
// items, itemLen bytes each.
type token struct {
	nodes int64 // 0: in the store
	items string
}

// parseToken parses t, refusing anything that is not a token as
// permitToken writes them.
func parseToken(t string) (token, bool) {
	if len(t) < 1+itemLen || len(t) > maxToken {
		return token{}, false
	}
	var v token
	switch t[0] {
	case 's':
		t = t[1:]
	case 'l':
		i := 1
		for ; i < len(t) && i <= 7 && t[i] >= '0' && t[i] <= '9'; i++ {
			v.nodes = v.nodes*10 + int64(t[i]-'0')
		}
		if i == 1 || t[1] == '0' || i >= len(t) || t[i] != '.' || v.nodes > maxNodes {
			return token{}, false
		}
		t = t[i+1:]
	default:
		return token{}, false
	}
	if len(t) == 0 || len(t)%itemLen != 0 || len(t)/itemLen > sluice.MaxHits {
		return token{}, false
	}
	for i := 0; i < len(t); i++ {
		c := t[i]
		var ok bool
		if i%itemLen < tagLen {
			ok = c >= '0' && c <= '9' || c >= 'a' && c <= 'f'
		} else {
			ok = c >= 'A' && c <= 'Z' || c >= '2' && c <= '7'
		}
		if !ok {
			return token{}, false
		}
	}
	v.items = t
	return v, true
}

// releaseScratch is the storage of a request's release descriptors.
type releaseScratch struct {
	sub    Request            // the descriptors decided
	idx    []int              // their indexes in the request
	descs  []rules.Descriptor // the release descriptors
	tokens []string           // their tokens
	where  []int8             // what became of each (refused, inStore, inNode, noLimit)
	gone   []bool             // whether the store removed one of its permits
	store  []sluice.Hit       // the permits to release in the store
	node   []sluice.Hit       // and in the node's own store
	owner  [2][]int           // the descriptor that named each of store, node first
	out    [2][]sluice.Decision
	copies []copyRef    // the store's permits whose copies the node holds (mirror)
	copied []sluice.Hit // those copies (releaseCopies)
	cout   []sluice.Decision
}

// copyRef is a permit the store granted, by its hit in the plan and its
// ID, whose copy in the node's own store a token release gives back.
type copyRef struct {
	hit int
	id  string
}

const (
	refused int8 = iota
	inStore
	inNode
	noLimit // a well-formed token on a descriptor of no concurrency limit
)

// decideReleasing decides r, whose Release is set: the release
// descriptors give back their permits, then the others are decided as a
// request of their own, and o holds the outcome of each descriptor in its
// place.
func (d *Decider) decideReleasing(ctx context.Context, r *Request, o *Outcome) error {
	switch {
	case len(r.Release) != len(r.Descriptors):
		return fmt.Errorf("%w: %d release tokens for %d descriptors", sluice.ErrInvalid, len(r.Release), len(r.Descriptors))
	case r.Reserve:
		return fmt.Errorf("%w: a request of reservations cannot release permits", sluice.ErrInvalid)
	}
	if err := checkRequest(r); err != nil {
		return err
	}
	s := d.plans.Get().(*scratch)
	defer d.plans.Put(s)
	rs := &s.rel
	rs.sub = Request{Domain: r.Domain, Descriptors: rs.sub.Descriptors[:0], Prefer: r.Prefer}
	rs.idx, rs.descs, rs.tokens = rs.idx[:0], rs.descs[:0], rs.tokens[:0]
	for i := range r.Descriptors {
		if r.Release[i] == "" {
			rs.sub.Descriptors = append(rs.sub.Descriptors, r.Descriptors[i])
			rs.idx = append(rs.idx, i)
			continue
		}
		rs.descs = append(rs.descs, r.Descriptors[i])
		rs.tokens = append(rs.tokens, r.Release[i])
	}
	rc, err := d.release(ctx, s, r.Domain)
	clear(rs.descs)
	clear(rs.tokens)
	if err != nil {
		clear(rs.sub.Descriptors)
		o.Reset()
		return err
	}
	if len(rs.sub.Descriptors) > 0 {
		err = d.decideAll(ctx, &rs.sub, o)
		clear(rs.sub.Descriptors)
		if err != nil {
			return err
		}
	} else {
		o.Reset()
		o.Overall = sluice.Decision{Allowed: true, Index: -1}
	}
	o.spread(rs.idx, len(r.Descriptors))
	o.Released, o.ReleaseStale, o.ReleaseRefused, o.ReleaseFailed, o.ReleaseErr = rc.released, rc.stale, rc.refused, rc.failed, rc.err
	return nil
}

// releaseCounts counts what became of a request's release descriptors
// (Outcome.Released and the rest), err the store's failure.
type releaseCounts struct {
	released, stale, refused, failed int
	err                              error
}

// release gives back the permits that each release descriptor of s.rel
// names with its token on its own concurrency limits, at most
// sluice.MaxHits in all, in one call to the store (and one to the node's
// own store for the local policy's). It counts the descriptors whose
// permits were given back (the store removed one at least: a permit
// named by several descriptors counts for the first), those whose permits
// the store no longer held (stale: released before, replayed, expired),
// those refused, and those that failed; err is what makes the request
// itself fail: descriptors that are invalid, no rules loaded. A
// descriptor whose token is well formed but that plans no concurrency
// limit counts in none: sluice proxy --store remote sends its token on
// every descriptor of the request, not knowing which hold the permits.
func (d *Decider) release(ctx context.Context, s *scratch, domain string) (c releaseCounts, err error) {
	rs := &s.rel
	rs.where, rs.gone = rs.where[:0], rs.gone[:0]
	// A descriptor with no entry but its token plans nothing.
	descs, tokens := rs.descs[:0], rs.tokens[:0]
	for i := range rs.descs {
		if len(rs.descs[i].Entries) == 0 {
			c.refused++
			continue
		}
		descs, tokens = append(descs, rs.descs[i]), append(tokens, rs.tokens[i])
	}
	if len(descs) == 0 {
		return c, nil
	}
	if err := d.plan(s, domain, descs); err != nil {
		return releaseCounts{}, err
	}
	rs.store, rs.node, rs.copies = rs.store[:0], rs.node[:0], rs.copies[:0]
	rs.owner[0], rs.owner[1] = rs.owner[0][:0], rs.owner[1][:0]
	mirrored := d.failover.Local != nil && d.policyOf(s.plan.Domain) == rules.FailLocal
	var local []sluice.Hit // the plan's hits as the local policy holds them
	var nodes int64
	for j := range descs {
		v, ok := parseToken(tokens[j])
		switch {
		case !ok:
		case v.nodes == 0:
		case d.failover.Local == nil || nodes != 0 && v.nodes != nodes:
			ok = false
		case local == nil:
			nodes = v.nodes
			local = d.failover.localHits(s, nodes)
		}
		w := refused
		if ok {
			w = d.collect(s, j, &v, local, mirrored)
		}
		rs.where = append(rs.where, w)
		rs.gone = append(rs.gone, false)
	}
	return d.giveBack(ctx, s, local, c), nil
}

// collect adds to s.rel the permits that descriptor j's token v names on
// its concurrency limits (the local policy's as local holds them), and
// says where they are: noLimit when j plans no concurrency limit,
// refused when the token names none of its limits.
func (d *Decider) collect(s *scratch, j int, v *token, local []sluice.Hit, mirrored bool) int8 {
	rs, p := &s.rel, &s.plan
	var tag [tagLen]byte
	n, conc := 0, false
	m := &p.Matches[j]
	for i := m.First; i < m.First+m.Count; i++ {
		h := &p.Hits[i]
		if h.Limit.Algorithm != sluice.Concurrency {
			continue
		}
		conc = true
		appendTag(tag[:0], h.Key) // fills tag, whose capacity it is
		for k := 0; k < len(v.items); k += itemLen {
			item := v.items[k : k+itemLen]
			if item[:tagLen] != string(tag[:]) {
				continue
			}
			n++
			rh := sluice.Hit{Key: h.Key, Limit: h.Limit, Permit: item[tagLen:]}
			d.held.tokens.forget(rh.Permit) // not to be held again (regrant.go)
			if v.nodes == 0 {
				if mirrored && len(rs.copies) < sluice.MaxHits {
					rs.copies = append(rs.copies, copyRef{hit: i, id: rh.Permit})
				}
				rs.add(rh, 0, j)
				continue
			}
			// The local policy's: not to be handed over now, and, if it
			// was, released in the store too (handover.go).
			d.held.forget(rh.Permit)
			if d.held.ever.Load() {
				rs.add(rh, 0, j)
			}
			rh.Key, rh.Limit = local[i].Key, local[i].Limit
			rs.add(rh, 1, j)
		}
	}
	switch {
	case n == 0 && !conc:
		return noLimit
	case n == 0:
		return refused
	case v.nodes == 0:
		return inStore
	}
	return inNode
}

// add puts rh, named by descriptor j, on the list of the store (w 0) or
// of the node's own store (w 1), once, while both hold fewer than
// sluice.MaxHits.
func (rs *releaseScratch) add(rh sluice.Hit, w, j int) {
	list := &rs.store
	if w == 1 {
		list = &rs.node
	}
	if !slices.Contains(*list, rh) && len(rs.store)+len(rs.node) < sluice.MaxHits {
		*list = append(*list, rh)
		rs.owner[w] = append(rs.owner[w], j)
	}
}

// giveBack releases what collect put in s.rel, in one call to the store
// and one to the node's own store, and adds to c what became of each
// descriptor.
func (d *Decider) giveBack(ctx context.Context, s *scratch, local []sluice.Hit, c releaseCounts) releaseCounts {
	rs := &s.rel
	var storeErr, nodeErr error
	if len(rs.store) > 0 {
		rs.out[0] = slices.Grow(rs.out[0][:0], len(rs.store))[:len(rs.store)]
		storeErr = d.limiter.Release(ctx, rs.store, rs.out[0])
	}
	if len(rs.node) > 0 {
		rs.out[1] = slices.Grow(rs.out[1][:0], len(rs.node))[:len(rs.node)]
		nodeErr = d.failover.Local.Release(ctx, rs.node, rs.out[1])
	}
	if len(rs.copies) > 0 {
		d.releaseCopies(ctx, s, local)
	}
	for w, failed := range [2]bool{storeErr != nil, nodeErr != nil} {
		for k, j := range rs.owner[w] {
			if !failed && rs.out[w][k].Allowed {
				rs.gone[j] = true
			}
		}
	}
	clear(rs.store)
	clear(rs.node)
	for j, w := range rs.where {
		switch {
		case w == noLimit:
		case w == refused:
			c.refused++
		case w == inStore && storeErr != nil, w == inNode && nodeErr != nil:
			c.failed++
		case rs.gone[j]:
			c.released++
		default:
			c.stale++
		}
	}
	c.err = errors.Join(storeErr, nodeErr)
	return c
}

// spread puts the outcomes of o, those of the descriptors decided, in
// their places among the n descriptors of the request (idx[k] for the
// k-th), and the outcome of a release descriptor in the others.
func (o *Outcome) spread(idx []int, n int) {
	k := len(o.Descriptors)
	o.Descriptors = slices.Grow(o.Descriptors, n-k)[:n]
	for j := k - 1; j >= 0; j-- {
		o.Descriptors[idx[j]] = o.Descriptors[j]
	}
	next := 0
	for i := range n {
		if next < len(idx) && idx[next] == i {
			next++
			continue
		}
		o.Descriptors[i] = DescriptorOutcome{Release: true, Decision: sluice.Decision{Allowed: true}}
	}
	for i := range o.Limits {
		if j := o.Limits[i].Descriptor; j >= 0 {
			o.Limits[i].Descriptor = idx[j]
		}
	}
}

// holdRemote makes o.Permit of the permits that the remote's answer to
// r names in o.PermitToken. Its Release gives them back as Envoy does
// when its stream is done: one call to the remote with r's descriptors,
// each carrying the token (Request.Release), since the answer does not
// say which descriptors hold the permits (on each, the remote releases
// the IDs whose tag its own concurrency limits carry). The call is
// bounded by the remote's own timeout and not by the context Release is
// given, so that a client that hangs up gives its slots back; its answer
// is not read. A token that is not one (parseToken) is dropped, and its
// permits expire by their TTL.
func (d *Decider) holdRemote(ctx context.Context, r *Request, o *Outcome) {
	v, ok := parseToken(o.PermitToken)
	if !ok {
		o.PermitToken = ""
		return
	}
	rel := &Request{Domain: r.Domain, Descriptors: copyDescriptors(r.Descriptors), Release: make([]string, len(r.Descriptors))}
	for i := range rel.Release {
		rel.Release[i] = o.PermitToken
	}
	remote := d.remote
	release := func(ctx context.Context) error {
		var ro Outcome
		return remote.Ask(context.WithoutCancel(ctx), rel, &ro)
	}
	o.Permit = permitfunc.New(ctx, len(v.items)/itemLen, release).(*sluice.Permit)
}

// copyDescriptors is a copy of descs that shares nothing with them but
// the strings.
func copyDescriptors(descs []rules.Descriptor) []rules.Descriptor {
	n := 0
	for i := range descs {
		n += len(descs[i].Entries)
	}
	out := make([]rules.Descriptor, len(descs))
	entries := make([]rules.Entry, 0, n)
	for i, d := range descs {
		k := len(entries)
		entries = append(entries, d.Entries...)
		out[i] = rules.Descriptor{Entries: entries[k:len(entries):len(entries)], Cost: d.Cost}
		if d.Override != nil {
			ov := *d.Override
			out[i].Override = &ov
		}
	}
	return out
}

// releaseCopies gives back the copies in the node's own store (mirror)
// of the store's permits that s.rel.copies names, so that the node's
// share no longer counts their holders, whether or not the store could
// release them: the holder has ended. local is the plan's hits as the
// node's store holds them, or nil. A copy not held (none was made, it
// expired) is nothing to give back, and a failure leaves it to expire
// by its TTL, as the store's permit does: neither is counted.
func (d *Decider) releaseCopies(ctx context.Context, s *scratch, local []sluice.Hit) {
	rs, f := &s.rel, &d.failover
	if local == nil {
		local = f.localHits(s, f.nodes()) // a copy's key and identity do not depend on n
	}
	rs.copied = rs.copied[:0]
	for _, c := range rs.copies {
		rs.copied = append(rs.copied, sluice.Hit{Key: local[c.hit].Key, Limit: local[c.hit].Limit, Permit: c.id})
	}
	rs.cout = slices.Grow(rs.cout[:0], len(rs.copied))[:len(rs.copied)]
	_ = f.Local.Release(ctx, rs.copied, rs.cout)
	clear(rs.copies)
	clear(rs.copied)
}
