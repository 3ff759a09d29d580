package decide_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/testsupport/redistest"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/rules"
)

func scheduleDecider(t *testing.T, store sluice.Store, now func() time.Time, src string) *decide.Decider {
	t.Helper()
	d, err := rules.Parse("sched.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := rules.NewConfig(d)
	if err != nil {
		t.Fatal(err)
	}
	dec, err := decide.New(decide.Config{Limiter: sluice.NewLimiter(store), Rules: cfg, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	return dec
}

// take decides one request of descriptor k=v and says whether it passed.
func take(t *testing.T, dec *decide.Decider, entry string) bool {
	t.Helper()
	o := decideOne(t, dec, entry)
	return !o.OverLimit()
}

// admitted counts the requests of entry admitted out of n.
func admitted(t *testing.T, dec *decide.Decider, entry string, n int) int {
	t.Helper()
	ok := 0
	for range n {
		if take(t, dec, entry) {
			ok++
		}
	}
	return ok
}

// On the embedded store, on its clock: the window's limit applies from the
// instant it opens to the instant it closes, each in counters of its own,
// so neither side's count carries over the switch.
func TestScheduleSwitchesOnTheStoreClock(t *testing.T) {
	now := time.Date(2026, 12, 1, 0, 59, 0, 0, time.UTC) // Tuesday
	clock := func() time.Time { return now }
	store := memstore.New(memstore.Config{Now: clock})
	defer store.Close()
	dec := scheduleDecider(t, store, clock, `domain: sched
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 10}
    schedules:
      - {name: quiet, days: [mon-fri], from: "01:00", to: "02:00", tz: UTC, rate_limit: {unit: hour, requests_per_unit: 3}}
`)
	if got := admitted(t, dec, "k=a", 8); got != 8 {
		t.Fatalf("before the window: %d of 8 admitted, want 8 of the own limit of 10", got)
	}
	now = now.Add(time.Minute - time.Nanosecond)
	if got := admitted(t, dec, "k=a", 4); got != 2 {
		t.Fatalf("a nanosecond before the window: %d of 4 admitted, want the own limit's last 2", got)
	}
	now = now.Add(time.Nanosecond) // 01:00:00, the window opens
	if got := admitted(t, dec, "k=a", 5); got != 3 {
		t.Fatalf("in the window: %d of 5 admitted, want its own 3 (the rule's count does not carry)", got)
	}
	now = time.Date(2026, 12, 1, 1, 59, 59, 0, time.UTC)
	if take(t, dec, "k=a") {
		t.Fatal("the window's limit, spent, admitted before it closed")
	}
	now = time.Date(2026, 12, 1, 2, 0, 0, 0, time.UTC) // the window closes; the own hour is new
	if got := admitted(t, dec, "k=a", 12); got != 10 {
		t.Fatalf("after the window: %d of 12 admitted, want a new hour's 10", got)
	}
}

// On Redis and on leases over Redis, whose clock is Redis's TIME and
// cannot be set: rules built around the real time, one with a window that
// holds now and one with a window that does not, choose by the estimate
// of Redis's clock.
func TestScheduleOnRedis(t *testing.T) {
	srv := redistest.Standalone(t)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	newRedis := func(t *testing.T) *redisstore.Store {
		rs, err := redisstore.New(redisstore.Config{URL: srv.URL(), Prefix: fmt.Sprintf("sched-%d:", time.Now().UnixNano()), Timeout: 5 * time.Second, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rs.Close() })
		return rs
	}
	for _, tc := range []struct {
		name        string
		consistency string
		store       func(rs *redisstore.Store) sluice.Store
	}{
		{"redis", "exact", func(rs *redisstore.Store) sluice.Store { return rs }},
		{"lease", "lease", func(rs *redisstore.Store) sluice.Store { return lease.New(rs, lease.Config{}) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := newRedis(t) // New samples Redis's clock before it returns
			if _, ok := clock.ClockError(); !ok {
				t.Fatal("no sample of Redis's clock")
			}
			// A window from a minute ago to three minutes on holds for the
			// test; one from an hour on does not.
			at := clock.Now().UTC()
			hm := func(d time.Duration) string { return at.Add(d).Format("15:04") }
			src := fmt.Sprintf(`domain: sched
consistency: %s
max_overshoot: 1
descriptors:
  - key: held
    rate_limit: {unit: hour, requests_per_unit: 100}
    schedules:
      - {name: now, from: "%s", to: "%s", tz: UTC, rate_limit: {unit: hour, requests_per_unit: 3}}
  - key: later
    rate_limit: {unit: hour, requests_per_unit: 2}
    schedules:
      - {name: later, from: "%s", to: "%s", tz: UTC, rate_limit: {unit: hour, requests_per_unit: 50}}
`, tc.consistency, hm(-time.Minute), hm(3*time.Minute), hm(time.Hour), hm(time.Hour+10*time.Minute))
			dec := scheduleDecider(t, tc.store(clock), clock.Now, src)
			if got := admitted(t, dec, "held=x", 6); got != 3 {
				t.Errorf("a window that holds: %d of 6 admitted, want its 3", got)
			}
			if got := admitted(t, dec, "later=x", 6); got != 2 {
				t.Errorf("a window that does not hold: %d of 6 admitted, want the own 2", got)
			}
			e, err := dec.Explain(context.Background(), "sched", []rules.Descriptor{{Entries: []rules.Entry{{Key: "held", Value: "x"}}, Cost: 1}})
			if err != nil {
				t.Fatal(err)
			}
			if de := e.Descriptors[0]; !strings.HasPrefix(de.Schedule, "now (every day ") || de.Until == "" || !strings.Contains(de.Why, "holds now, until ") {
				t.Errorf("explain: schedule %q until %q why %q", de.Schedule, de.Until, de.Why)
			}
		})
	}
}

// decideOne decides one request of entry on dec and returns its outcome.
func decideOne(t *testing.T, dec *decide.Decider, entry string) decide.Outcome {
	t.Helper()
	k, v, _ := strings.Cut(entry, "=")
	var o decide.Outcome
	r := decide.Request{Domain: "sched", Descriptors: []rules.Descriptor{{Entries: []rules.Entry{{Key: k, Value: v}}, Cost: 1}}}
	if err := dec.Decide(context.Background(), &r, &o); err != nil {
		t.Fatal(err)
	}
	return o
}

// A month from its anchor day in Berlin, on the embedded store's clock:
// the denial's Retry-After counts down to the local midnight that starts
// the next period, which starts afresh.
func TestCalendarMonthOnTheStoreClock(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	boundary := time.Date(2027, 2, 28, 0, 0, 0, 0, berlin) // anchor 31, clamped to February's last day
	now := boundary.Add(-3 * time.Second)
	clock := func() time.Time { return now }
	store := memstore.New(memstore.Config{Now: clock})
	defer store.Close()
	dec := scheduleDecider(t, store, clock, `domain: sched
descriptors:
  - key: plan
    rate_limit: {unit: month, requests_per_unit: 3, calendar: {tz: Europe/Berlin, anchor_day: 31}}
`)
	for range 3 {
		if o := decideOne(t, dec, "plan=pro"); o.OverLimit() {
			t.Fatal("denied within the month's 3")
		}
	}
	o := decideOne(t, dec, "plan=pro")
	if !o.OverLimit() || o.Limits[0].Decision.RetryAfter != 3*time.Second {
		t.Fatalf("the 4th: over %v retry %v, want denied until the local midnight 3s away", o.OverLimit(), o.Limits[0].Decision.RetryAfter)
	}
	now = boundary
	o = decideOne(t, dec, "plan=pro")
	next := time.Date(2027, 3, 31, 0, 0, 0, 0, berlin)
	if o.OverLimit() || o.Limits[0].Decision.ResetAfter != next.Sub(boundary) || o.Limits[0].Decision.Remaining != 2 {
		t.Fatalf("at the anchor: over %v reset %v remaining %d, want a new month of %v", o.OverLimit(), o.Limits[0].Decision.ResetAfter, o.Limits[0].Decision.Remaining, next.Sub(boundary))
	}
}

// On Redis, whose clock cannot be set: a calendar day in UTC resets at
// Redis's next midnight, and its key expires then.
func TestCalendarOnRedis(t *testing.T) {
	srv := redistest.Standalone(t)
	prefix := fmt.Sprintf("cal-%d:", time.Now().UnixNano())
	rs, err := redisstore.New(redisstore.Config{URL: srv.URL(), Prefix: prefix, Timeout: 5 * time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	dec := scheduleDecider(t, rs, rs.Now, `domain: sched
descriptors:
  - key: plan
    rate_limit: {unit: day, requests_per_unit: 2, calendar: {tz: UTC}}
`)
	decideOne(t, dec, "plan=x")
	decideOne(t, dec, "plan=x")
	o := decideOne(t, dec, "plan=x")
	now, err := srv.Time()
	if err != nil {
		t.Fatal(err)
	}
	midnight := now.UTC().Truncate(24 * time.Hour).Add(24 * time.Hour)
	if d := o.Limits[0].Decision.RetryAfter - midnight.Sub(now); !o.OverLimit() || d < -2*time.Second || d > 2*time.Second {
		t.Fatalf("the 3rd: over %v retry %v, want denied until Redis's midnight, %v away", o.OverLimit(), o.Limits[0].Decision.RetryAfter, midnight.Sub(now))
	}
	keys, err := srv.Do("KEYS", prefix+"{*")
	if err != nil {
		t.Fatal(err)
	}
	ks, _ := keys.([]any) // the counters' keys (beside the nodes' registry)
	if len(ks) != 1 {
		t.Fatalf("keys %v, want the day's one", keys)
	}
	ttl, err := srv.Do("PTTL", ks[0])
	if err != nil {
		t.Fatal(err)
	}
	ms, _ := ttl.(int64)
	if d := time.Duration(ms)*time.Millisecond - midnight.Sub(now); d < -2*time.Second || d > time.Minute {
		t.Errorf("the key expires in %v, want at Redis's midnight, %v away (and a little slack)", time.Duration(ms)*time.Millisecond, midnight.Sub(now))
	}
}

// A calendar period's count survives a restart of the embedded store (its
// snapshot, as --state-file writes it) and a reload of rules that keep the
// limit, in the same period.
func TestCalendarSurvivesRestart(t *testing.T) {
	now := time.Date(2027, 2, 10, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	src := `domain: sched
descriptors:
  - key: plan
    rate_limit: {unit: month, requests_per_unit: 3, calendar: {tz: Europe/Berlin, anchor_day: 15}}
`
	before := memstore.New(memstore.Config{Now: clock})
	dec := scheduleDecider(t, before, clock, src)
	if got := admitted(t, dec, "plan=pro", 2); got != 2 {
		t.Fatalf("%d of 2 admitted", got)
	}
	var snap bytes.Buffer
	if err := before.Snapshot(&snap); err != nil {
		t.Fatal(err)
	}
	before.Close()
	now = now.Add(24 * time.Hour) // the next day, the same period
	after := memstore.New(memstore.Config{Now: clock})
	defer after.Close()
	if err := after.Restore(&snap); err != nil {
		t.Fatal(err)
	}
	dec = scheduleDecider(t, after, clock, src+"  - key: other\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	if got := admitted(t, dec, "plan=pro", 3); got != 1 {
		t.Fatalf("after the restart and a reload: %d of 3 admitted, want the period's last 1", got)
	}
}
