package decide

// SetWriteBackClock sets the clock of d's write-back horizons (Unix ns),
// for tests whose stores run on a clock of their own.
func SetWriteBackClock(d *Decider, now func() int64) { d.clock = now }

// TokenGrants returns how many token Permits d records to hold again
// (not released), how many it did not record, and the cap.
func TokenGrants(d *Decider) (live, dropped int64, most int) {
	return d.held.tokens.live.Load(), d.held.tokens.dropped.Load(), maxLedger
}
