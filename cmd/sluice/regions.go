package main

import (
	"flag"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/stores/regions"
	"github.com/sluicehq/sluice/redisstore"
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

// wrap puts the region tier in front of set's store.
func (r *regionSettings) wrap(set *storeSet, log *slog.Logger) error {
	names, shares, err := r.parse()
	if err != nil {
		return err
	}
	coord, err := redisstore.New(redisstore.Config{URL: r.coordinator, Prefix: "sluice:regions:", Logger: log.With("component", "coordinator")})
	if err != nil {
		return fmt.Errorf("--coordinator-url: %w", err)
	}
	rs, err := regions.New(regions.Config{
		Next: set.store, Region: r.region, Regions: names, Shares: shares,
		Ledger: &regions.RedisLedger{Client: coord.Client, Prefix: "sluice:regions:"},
		Now:    set.redis.Now,
		Error: func() time.Duration {
			e, _ := set.redis.ClockError()
			return e
		},
		Interval: r.interval,
		Nodes:    set.redis.Nodes,
		Logger:   log.With("component", "regions"),
	})
	if err != nil {
		coord.Close()
		return err
	}
	closeAll := set.close
	set.close = func() { rs.Close(); coord.Close(); closeAll() }
	set.store, set.regions, set.region = rs, rs, r.region
	return nil
}

// regionCollector exports the region tier's counters as sluice_region_*.
func regionCollector(region string, rs *regions.Store) prometheus.Collector {
	labels := prometheus.Labels{"region": region}
	c := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_region_" + name, Help: help, ConstLabels: labels}, f)
	}
	g := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_region_" + name, Help: help, ConstLabels: labels}, f)
	}
	return promCollectors{
		c("granted_hits_total", "Hits of global limits the coordinator granted this node's region, beyond its safe share.", func() float64 { return float64(rs.Stats().Granted) }),
		c("given_back_hits_total", "Hits of global limits this node gave back to the coordinator.", func() float64 { return float64(rs.Stats().GivenBack) }),
		c("ledger_errors_total", "Calls to the coordinator that failed.", func() float64 { return float64(rs.Stats().LedgerErrors) }),
		c("counters_lost_total", "Global keys whose counters the region's Redis lost mid-window (restarted empty, flushed), charged again for what the region had left.", func() float64 { return float64(rs.Stats().Lost) }),
		c("admitted_hits_total", "Hits of global limits admitted on this node.", func() float64 { return float64(rs.Stats().Admitted) }),
		c("denied_hits_total", "Hits of global limits denied on this node (refusals).", func() float64 { return float64(rs.Stats().Denied) }),
		g("allocation_hits", "This window's allocation of the global limits this node decided, as it knows it: the safe shares, plus its grants, less its give-backs.", func() float64 { return float64(rs.Stats().Allocation) }),
		g("demand_hits_per_second", "Hits of global limits asked on this node per second, smoothed.", func() float64 { return float64(rs.Stats().Demand) }),
		g("last_grant_timestamp_seconds", "When the coordinator last granted this node's region more (Unix seconds), 0 never.", func() float64 { return float64(rs.Stats().LastGrant) / 1e9 }),
	}
}

// promCollectors is several collectors as one.
type promCollectors []prometheus.Collector

func (cs promCollectors) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range cs {
		c.Describe(ch)
	}
}

func (cs promCollectors) Collect(ch chan<- prometheus.Metric) {
	for _, c := range cs {
		c.Collect(ch)
	}
}
