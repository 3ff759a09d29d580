package logsample_test

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/base/logsample"
)

func TestAllow(t *testing.T) {
	var s logsample.Sampler
	t0 := time.Unix(1_700_000_000, 0)
	for _, tc := range []struct {
		at      time.Duration
		ok      bool
		dropped int64
	}{
		{0, true, 0},
		{time.Millisecond, false, 0},
		{999 * time.Millisecond, false, 0},
		{time.Second, true, 2},
		{1500 * time.Millisecond, false, 0},
		{5 * time.Second, true, 1},
		{5 * time.Second, false, 0},
	} {
		dropped, ok := s.Allow(t0.Add(tc.at))
		if ok != tc.ok || dropped != tc.dropped {
			t.Errorf("at %v: %d, %v; want %d, %v", tc.at, dropped, ok, tc.dropped, tc.ok)
		}
	}
}
