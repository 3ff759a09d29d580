package lease

// Sweeps is how many sweeps of the leases s made.
func (s *Store) Sweeps() int64 { return s.sweeps.Load() }
