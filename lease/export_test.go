package lease

import "time"

// Sweeps is how many sweeps of the leases s made.
func (s *Store) Sweeps() int64 { return s.sweeps.Load() }

// Sweep is sweep: it drops the leases expired at now.
func (s *Store) Sweep(now time.Duration) { s.sweep(now) }
