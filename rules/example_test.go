package rules_test

import (
	"fmt"

	"github.com/sluicehq/sluice/rules"
)

func Example() {
	d, err := rules.Parse("messaging.yaml", []byte(`
domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit: {unit: day, requests_per_unit: 5}
  - key: to_number
    rate_limit: {unit: day, requests_per_unit: 100}
`))
	if err != nil {
		fmt.Println(err)
		return
	}
	cfg, err := rules.NewConfig(d)
	if err != nil {
		fmt.Println(err)
		return
	}

	var p rules.Plan // reuse across requests
	err = cfg.Plan("messaging", []rules.Descriptor{
		{Entries: []rules.Entry{{Key: "message_type", Value: "marketing"}, {Key: "to_number", Value: "2061111111"}}, Cost: 1},
		{Entries: []rules.Entry{{Key: "to_number", Value: "2061111111"}}, Cost: 1},
		{Entries: []rules.Entry{{Key: "from_number", Value: "2062222222"}}, Cost: 1},
	}, &p)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, m := range p.Matches {
		fmt.Println(m.Status, m.StatKey)
		for _, h := range p.Hits[m.First : m.First+m.Count] {
			fmt.Printf("  %d per %s\n", h.Limit.Rate, h.Limit.Period)
		}
	}
	// Hand p.Hits to sluice.Limiter.Decide: all are decided together.

	// Output:
	// limited messaging.message_type_marketing.to_number
	//   5 per 24h0m0s
	// limited messaging.to_number
	//   100 per 24h0m0s
	// no_match
}

func ExampleError() {
	_, err := rules.Parse("bad.yaml", []byte(`domain: api
descriptors:
  - key: user
    rate_limit: {unit: fortnight, requests_per_unit: 10}
  - value: premium
`))
	fmt.Println(err)
	// Output:
	// bad.yaml:4:24: invalid rate limit unit 'fortnight' (want one of second, minute, hour, day, week, month, year)
	// bad.yaml:5:5: descriptor has empty key (every descriptor needs a key:)
}
