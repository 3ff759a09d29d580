package breaker

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/storetest"
)

var errDown = errors.New("connection refused")

func newClock() *storetest.Clock { return storetest.NewClock(storetest.Start) }

// call runs one call through b with the outcome err, reporting what Allow
// said.
func call(b *Breaker, err error) error {
	if e := b.Allow(); e != nil {
		return e
	}
	b.Done(err)
	return nil
}

func expectState(t *testing.T, b *Breaker, want State) {
	t.Helper()
	if got := b.State(); got != want {
		t.Fatalf("state %v, want %v", got, want)
	}
}

func TestDefaults(t *testing.T) {
	b := New(Config{})
	if b.threshold != DefaultFailures || b.base != DefaultCooldown || b.limit != DefaultMaxCooldown {
		t.Errorf("defaults %d %v %v", b.threshold, b.base, b.limit)
	}
	b = New(Config{Cooldown: 10 * time.Second})
	if b.limit != 10*time.Second {
		t.Errorf("max cooldown %v below the cooldown", b.limit)
	}
	for s, want := range map[State]string{Closed: "closed", HalfOpen: "half_open", Open: "open", 7: "breaker.State(7)"} {
		if s.String() != want {
			t.Errorf("%d: %q", int(s), s.String())
		}
	}
}

func TestOpensAfterConsecutiveFailures(t *testing.T) {
	c := newClock()
	b := New(Config{Failures: 3, Now: c.Now})
	for range 2 {
		call(b, errDown)
	}
	// A success in between resets the count.
	call(b, nil)
	for range 2 {
		if err := call(b, errDown); err != nil {
			t.Fatal(err)
		}
	}
	expectState(t, b, Closed)
	if err := call(b, errDown); err != nil {
		t.Fatal(err)
	}
	expectState(t, b, Open)
	for range 10 {
		if err := b.Allow(); !errors.Is(err, ErrOpen) {
			t.Fatalf("open breaker: %v", err)
		}
	}
	c.Advance(DefaultCooldown - 1)
	if err := b.Allow(); !errors.Is(err, ErrOpen) {
		t.Fatalf("before the cooldown ends: %v", err)
	}
}

func TestProbeAndRecovery(t *testing.T) {
	c := newClock()
	b := New(Config{Failures: 1, Cooldown: time.Second, Now: c.Now})
	call(b, errDown)
	expectState(t, b, Open)
	c.Advance(time.Second)

	// One probe at a time.
	if err := b.Allow(); err != nil {
		t.Fatalf("probe: %v", err)
	}
	expectState(t, b, HalfOpen)
	for range 5 {
		if err := b.Allow(); !errors.Is(err, ErrOpen) {
			t.Fatalf("second probe: %v", err)
		}
	}
	b.Done(nil)
	expectState(t, b, Closed)
	for range 5 {
		if err := call(b, nil); err != nil {
			t.Fatalf("after recovery: %v", err)
		}
	}
	// Recovery restarted the count and the cooldown.
	call(b, errDown)
	expectState(t, b, Open)
	c.Advance(time.Second)
	if err := b.Allow(); err != nil {
		t.Fatalf("probe after a reset cooldown: %v", err)
	}
}

func TestCooldownDoublesUpToTheCap(t *testing.T) {
	c := newClock()
	b := New(Config{Failures: 2, Cooldown: 100 * time.Millisecond, MaxCooldown: time.Second, Now: c.Now})
	call(b, errDown)
	call(b, errDown)
	for i, want := range []time.Duration{100, 200, 400, 800, 1000, 1000} {
		want *= time.Millisecond
		c.Advance(want - 1)
		if err := b.Allow(); !errors.Is(err, ErrOpen) {
			t.Fatalf("open period %d: allowed before %v", i, want)
		}
		c.Advance(1)
		if err := b.Allow(); err != nil {
			t.Fatalf("open period %d: no probe after %v: %v", i, want, err)
		}
		b.Done(errDown) // the probe fails: open for twice as long
		expectState(t, b, Open)
	}
	// A success resets the cooldown.
	c.Advance(time.Second)
	call(b, nil)
	expectState(t, b, Closed)
	call(b, errDown)
	call(b, errDown)
	c.Advance(100 * time.Millisecond)
	if err := b.Allow(); err != nil {
		t.Fatalf("cooldown not reset: %v", err)
	}
}

// A probe that never reports does not wedge the breaker: after a cooldown
// another call probes.
func TestLostProbe(t *testing.T) {
	c := newClock()
	b := New(Config{Failures: 1, Cooldown: time.Second, Now: c.Now})
	call(b, errDown)
	c.Advance(time.Second)
	if err := b.Allow(); err != nil {
		t.Fatal(err)
	}
	// ... and never calls Done.
	c.Advance(time.Second - 1)
	if err := b.Allow(); !errors.Is(err, ErrOpen) {
		t.Fatalf("while the probe may still report: %v", err)
	}
	c.Advance(1)
	if err := b.Allow(); err != nil {
		t.Fatalf("the lost probe wedged the breaker: %v", err)
	}
	b.Done(nil)
	expectState(t, b, Closed)
}

// Outcomes of calls let through before the breaker opened change nothing
// while it is open.
func TestStragglers(t *testing.T) {
	c := newClock()
	b := New(Config{Failures: 2, Cooldown: time.Second, Now: c.Now})
	for range 3 {
		if err := b.Allow(); err != nil {
			t.Fatal(err)
		}
	}
	b.Done(errDown)
	b.Done(errDown)
	expectState(t, b, Open)
	b.Done(nil) // the third call succeeds late
	expectState(t, b, Open)
	b.Done(errDown)
	c.Advance(time.Second)
	if err := b.Allow(); err != nil {
		t.Fatalf("a late failure extended the cooldown: %v", err)
	}
}

func TestOnChange(t *testing.T) {
	c := newClock()
	b := New(Config{Failures: 1, Cooldown: time.Second, Now: c.Now})
	var got []string
	b.OnChange(func(from, to State) { got = append(got, from.String()+">"+to.String()) })
	call(b, errDown)
	c.Advance(time.Second)
	call(b, errDown)
	c.Advance(2 * time.Second)
	call(b, nil)
	want := []string{"closed>open", "open>half_open", "half_open>open", "open>half_open", "half_open>closed"}
	if len(got) != len(want) {
		t.Fatalf("changes %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("changes %v, want %v", got, want)
		}
	}
}

// With the default clock, in a bubble whose time moves only when every
// goroutine waits.
func TestSynctest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := New(Config{Failures: 2, Cooldown: 50 * time.Millisecond, MaxCooldown: 150 * time.Millisecond})
		call(b, errDown)
		call(b, errDown)
		start := time.Now()
		// A caller that retries until the breaker lets it through and
		// the backend is back after 300ms.
		for {
			err := b.Allow()
			if err == nil {
				up := time.Since(start) >= 300*time.Millisecond
				if up {
					b.Done(nil)
					break
				}
				b.Done(errDown)
				continue
			}
			time.Sleep(10 * time.Millisecond)
		}
		expectState(t, b, Closed)
		// Probes at 50, 50+100, 150+150, the last succeeding at 300ms.
		if got := time.Since(start); got != 300*time.Millisecond {
			t.Errorf("recovered after %v, want 300ms", got)
		}
	})
}

// Many callers at once when the cooldown ends: exactly one probes.
func TestOneProbeAmongMany(t *testing.T) {
	c := newClock()
	b := New(Config{Failures: 1, Cooldown: time.Second, MaxCooldown: time.Second, Now: c.Now})
	call(b, errDown)
	for round := range 50 {
		c.Advance(time.Second)
		var allowed atomic.Int32
		var wg sync.WaitGroup
		start := make(chan struct{})
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				if b.Allow() == nil {
					allowed.Add(1)
				}
			}()
		}
		close(start)
		wg.Wait()
		if n := allowed.Load(); n != 1 {
			t.Fatalf("round %d: %d probes let through", round, n)
		}
		b.Done(errDown)
	}
}

// Callers and a flapping backend under the race detector: the breaker ends
// up closed once the backend is back.
func TestConcurrent(t *testing.T) {
	c := newClock()
	b := New(Config{Failures: 3, Cooldown: time.Millisecond, Now: c.Now})
	var down atomic.Bool
	var changes atomic.Int64
	b.OnChange(func(State, State) { changes.Add(1) })
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if g == 0 && i%50 == 0 {
					c.Advance(time.Millisecond)
				}
				if b.Allow() != nil {
					continue
				}
				var err error
				if down.Load() {
					err = errDown
				}
				b.Done(err)
			}
		}()
	}
	for range 5 {
		down.Store(true)
		time.Sleep(20 * time.Millisecond)
		down.Store(false)
		time.Sleep(20 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	if changes.Load() == 0 {
		t.Error("the breaker never opened")
	}
	c.Advance(time.Hour)
	call(b, nil)
	expectState(t, b, Closed)
}

func TestClosedPathAllocs(t *testing.T) {
	b := New(Config{})
	if n := testing.AllocsPerRun(1000, func() {
		if b.Allow() == nil {
			b.Done(nil)
		}
	}); n != 0 {
		t.Errorf("%v allocations per closed call", n)
	}
}

func BenchmarkClosed(b *testing.B) {
	br := New(Config{})
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if br.Allow() == nil {
				br.Done(nil)
			}
		}
	})
}

func BenchmarkOpen(b *testing.B) {
	br := New(Config{Failures: 1, Cooldown: time.Hour})
	call(br, errDown)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if br.Allow() == nil {
				br.Done(nil)
			}
		}
	})
}
