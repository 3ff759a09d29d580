package algo_test

import (
	"fmt"
	"time"

	"github.com/sluicehq/sluice/internal/base/algo"
)

// A token bucket of 3, refilled with 3 tokens at every whole minute. The
// caller keeps the state and commits it only when the request is allowed.
func ExampleStep() {
	p := algo.Params{
		Kind:     algo.TokenBucket,
		Rate:     3,
		Period:   int64(time.Minute),
		Capacity: 3,
		Interval: int64(time.Minute),
	}
	start := time.Date(2017, 7, 12, 10, 0, 0, 0, time.UTC)
	var s algo.State
	for _, at := range []time.Duration{0, 10 * time.Second, 35 * time.Second, 45 * time.Second, time.Minute} {
		next, r := algo.Step(&p, s, start.Add(at).UnixNano(), 1)
		if r.Allowed {
			s = next
		}
		fmt.Printf("%s allowed=%v remaining=%d retry=%v\n",
			start.Add(at).Format("15:04:05"), r.Allowed, r.Remaining, time.Duration(r.RetryAfter))
	}
	// Output:
	// 10:00:00 allowed=true remaining=2 retry=0s
	// 10:00:10 allowed=true remaining=1 retry=0s
	// 10:00:35 allowed=true remaining=0 retry=0s
	// 10:00:45 allowed=false remaining=0 retry=15s
	// 10:01:00 allowed=true remaining=2 retry=0s
}

// An exact rolling window of 2 per second: the log holds the admitted hits.
func ExampleLogStep() {
	p := algo.Params{Kind: algo.SlidingLog, Rate: 2, Period: int64(time.Second), Capacity: 2}
	var log algo.Log
	for _, ms := range []int64{0, 400, 900, 1000, 1300} {
		now := ms * int64(time.Millisecond)
		expired, r := algo.LogStep(&p, &log, now, 1)
		cost := int64(0) // a denied request logs nothing but drops what expired
		if r.Allowed {
			cost = 1
		}
		log.Commit(expired, now, cost)
		fmt.Printf("%4dms allowed=%v retry=%v\n", ms, r.Allowed, time.Duration(r.RetryAfter))
	}
	// Output:
	//    0ms allowed=true retry=0s
	//  400ms allowed=true retry=0s
	//  900ms allowed=false retry=100ms
	// 1000ms allowed=true retry=0s
	// 1300ms allowed=false retry=100ms
}

// One sketch serves every key of a limit; the store hashes the keys.
func ExampleCMSketch() {
	p := algo.Params{Kind: algo.Sketch, Rate: 2, Period: int64(time.Minute), Capacity: 2}
	sk := algo.NewSketch(2048, 4)
	for i, key := range []uint64{0xa11ce, 0xb0b, 0xa11ce, 0xa11ce} {
		now := int64(i) * int64(time.Second)
		r := sk.Check(&p, key, now, 1)
		if r.Allowed {
			sk.Add(key, now, 1)
		}
		fmt.Printf("%x allowed=%v\n", key, r.Allowed)
	}
	fmt.Println(sk.Bytes()/1024, "KiB")
	// Output:
	// a11ce allowed=true
	// b0b allowed=true
	// a11ce allowed=true
	// a11ce allowed=false
	// 64 KiB
}
