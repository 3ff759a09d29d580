package rules

// The stats keys of matches, as envoyproxy/ratelimit computes them.

// matchStat sets m's stats key: its rule's, or, for a runtime override
// that no rule matched (Rule nil), the entries' own.
func (p *Plan) matchStat(m *Match, domain string, entries []Entry) {
	if m.Rule == nil {
		p.entriesStat(m, domain, entries)
		return
	}
	p.stat(m, domain, entries, p.levels[m.lv:m.lv+len(entries)])
}

// entriesStat sets m's stats key from the domain and the entries, as
// Envoy names a descriptor's own limit.
func (p *Plan) entriesStat(m *Match, domain string, entries []Entry) {
	m.statStart = len(p.buf)
	p.buf = append(p.buf, domain...)
	for _, e := range entries {
		p.buf = append(p.buf, '.')
		p.buf = append(p.buf, e.Key...)
		if e.Value != "" {
			p.buf = append(p.buf, '_')
			p.buf = append(p.buf, e.Value...)
		}
	}
	m.statEnd = len(p.buf)
}

// stat sets m's stats key as envoyproxy/ratelimit computes it.
func (p *Plan) stat(m *Match, domain string, entries []Entry, lv []level) {
	r := m.Rule
	start := len(p.buf)
	b := append(p.buf, domain...)
	if r.DetailedMetric {
		shared := false
		for i := range lv {
			shared = shared || lv[i].shared
		}
		for i, e := range entries {
			b = append(b, '.')
			b = append(b, e.Key...)
			switch {
			case lv[i].shared:
				b = append(b, '_')
				b = append(b, pattern(lv[i].rule.composite, e.Key)...)
			case !shared || e.Value != "":
				b = append(b, '_')
				b = append(b, e.Value...)
			}
		}
	} else {
		for i, e := range entries {
			b = append(b, '.')
			b = append(b, e.Key...)
			l := lv[i]
			switch {
			case l.how == howWildcard && l.shared:
				b = append(b, '_')
				b = append(b, pattern(l.rule.composite, e.Key)...)
			case l.how == howWildcard && !l.rule.ValueToMetric:
				b = append(b, '_')
				b = append(b, pattern(l.rule.composite, e.Key)...)
			case l.how == howExact, l.rule.ValueToMetric:
				if e.Value != "" {
					b = append(b, '_')
					b = append(b, e.Value...)
				}
			}
		}
	}
	if string(b[start:]) == r.StatKey {
		p.buf = b[:start]
		m.StatKey = r.StatKey
		return
	}
	p.buf = b
	m.statStart, m.statEnd = start, len(b)
}

// pattern is Envoy's wildcard value for stats and shared counters: the
// wildcard's composite key without the request key and underscore.
func pattern(composite, key string) string {
	if len(composite) > len(key) && composite[:len(key)] == key && composite[len(key)] == '_' {
		return composite[len(key)+1:]
	}
	return composite
}
