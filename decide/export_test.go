package decide

// SetWriteBackClock sets the clock of d's write-back horizons (Unix ns),
// for tests whose stores run on a clock of their own.
func SetWriteBackClock(d *Decider, now func() int64) { d.clock = now }
