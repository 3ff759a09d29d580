package main

import (
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/internal/stores/stack"
)

// regionSettings are the flags of the region tier (sluice serve --region):
// one limit across regions, each region deciding global limits from its
// allocation, which a coordinator Redis hands out (internal/stores/regions).
type regionSettings struct {
	region      string
	regions     string
	coordinator string
	interval    time.Duration
}

func (r *regionSettings) flags(fs *flag.FlagSet) {
	fs.StringVar(&r.region, "region", "", "`name` of this node's region: global limits (global: true) are decided from the region's allocation, granted by --coordinator-url; empty: no region tier")
	fs.StringVar(&r.regions, "regions", "", "every region, as `name[=share],...`: a region's safe share is the fraction of a global limit it may use without the coordinator (default: equal shares)")
	fs.StringVar(&r.coordinator, "coordinator-url", "", "the coordinator's Redis `URL` (redis://, rediss://), which keeps the regions' allocations")
	fs.DurationVar(&r.interval, "region-interval", 200*time.Millisecond, "how often a node asks the coordinator for more, or gives back what its region will not use")
}

// parse returns the regions and their shares (nil: equal).
func (r *regionSettings) parse() ([]string, []float64, error) {
	var names []string
	var shares []float64
	given := false
	for _, item := range strings.Split(r.regions, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, share, ok := strings.Cut(item, "=")
		f := 0.0
		if ok {
			v, err := strconv.ParseFloat(share, 64)
			if err != nil || v < 0 || v > 1 {
				return nil, nil, fmt.Errorf("--regions: share of %q must be a fraction from 0 to 1, got %q", name, share)
			}
			f, given = v, true
		}
		names = append(names, name)
		shares = append(shares, f)
	}
	if !given {
		shares = nil
	}
	return names, shares, nil
}

func (r *regionSettings) check(store string) []string {
	if r.region == "" {
		if r.regions != "" || r.coordinator != "" {
			return []string{"--regions and --coordinator-url need --region"}
		}
		return nil
	}
	var probs []string
	if store != "redis" {
		probs = append(probs, "--region needs --store redis: a region's nodes share its counters")
	}
	if r.coordinator == "" {
		probs = append(probs, "--region needs --coordinator-url")
	}
	if r.interval <= 0 {
		probs = append(probs, "--region-interval must be positive")
	}
	names, _, err := r.parse()
	if err != nil {
		probs = append(probs, err.Error())
	}
	found := false
	for _, n := range names {
		found = found || n == r.region
	}
	if !found {
		probs = append(probs, fmt.Sprintf("--regions must list --region %q", r.region))
	}
	return probs
}

// config is the region tier's configuration in the store stack.
func (r *regionSettings) config() (stack.RegionConfig, error) {
	names, shares, err := r.parse()
	if err != nil {
		return stack.RegionConfig{}, err
	}
	return stack.RegionConfig{Region: r.region, Regions: names, Shares: shares, Coordinator: r.coordinator, Interval: r.interval}, nil
}
