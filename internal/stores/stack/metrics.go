package stack

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/base/wheremetric"
	"github.com/sluicehq/sluice/internal/stores/regions"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/memstore"
)

// Collectors returns the Prometheus collectors of the stack's parts, one
// per part, for the caller to register: sluice_store_* (the embedded
// store), sluice_redis_* (Redis), sluice_local_cache_* (the cache),
// sluice_lease_* (the leases) and sluice_region_* (the region tier, with a
// region label), and sluice_permits_expired_total of the store at the
// bottom (store="memory" or "redis").
func (s *Stack) Collectors() Collectors {
	var cs Collectors
	if s.Mem != nil {
		cs = append(cs, memCollector(s.Mem))
	}
	if s.Redis != nil {
		cs = append(cs, s.Redis.Collector())
	}
	if s.Cache != nil {
		cs = append(cs, s.Cache.Collector("sluice"))
	}
	if s.Lease != nil {
		cs = append(cs, leaseCollector(s.Lease))
	}
	if s.Regions != nil {
		cs = append(cs, regionCollector(s.Region, s.Regions))
	}
	return cs
}

// Collectors is several collectors as one.
type Collectors []prometheus.Collector

// Describe implements prometheus.Collector.
func (cs Collectors) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range cs {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (cs Collectors) Collect(ch chan<- prometheus.Metric) {
	for _, c := range cs {
		c.Collect(ch)
	}
}

var (
	memKeysDesc = prometheus.NewDesc("sluice_store_keys",
		"Keys the embedded store holds state for.", nil, nil)
	memBytesDesc = prometheus.NewDesc("sluice_store_bytes",
		"Estimated memory of the embedded store, which --max-bytes (memstore.Config.MaxBytes) caps.", nil, nil)
	memEvictionsDesc = prometheus.NewDesc("sluice_store_evictions_total",
		"Keys evicted to stay within --max-bytes (memstore.Config.MaxBytes).", nil, nil)
	memExpiredDesc   = wheremetric.PermitsExpiredDesc("memory")
	localExpiredDesc = wheremetric.PermitsExpiredDesc("local")
)

// memCollector returns the metrics of the embedded store: sluice_store_keys
// and sluice_store_bytes (gauges), sluice_store_evictions_total and
// sluice_permits_expired_total{store="memory"} (counters), read from one
// Stats call per scrape. It lives here, not in memstore, so that a program
// that embeds the store without Prometheus does not link the client.
func memCollector(m *memstore.Store) prometheus.Collector { return memMetrics{m: m} }

// LocalCollector returns the metrics of the local failure policy's store
// (decide.Failover.Local), m: sluice_permits_expired_total{store="local"},
// the permits it held while the store was down that expired unreleased.
// Its keys and memory are not exported: they live only while the store
// is down.
func LocalCollector(m *memstore.Store) prometheus.Collector { return memMetrics{m: m, local: true} }

type memMetrics struct {
	m     *memstore.Store
	local bool // the local failure policy's: its expired permits only
}

func (c memMetrics) Describe(ch chan<- *prometheus.Desc) {
	if c.local {
		ch <- localExpiredDesc
		return
	}
	ch <- memKeysDesc
	ch <- memBytesDesc
	ch <- memEvictionsDesc
	ch <- memExpiredDesc
}

func (c memMetrics) Collect(ch chan<- prometheus.Metric) {
	st := c.m.Stats()
	if c.local {
		ch <- prometheus.MustNewConstMetric(localExpiredDesc, prometheus.CounterValue, float64(st.PermitsExpired))
		return
	}
	ch <- prometheus.MustNewConstMetric(memKeysDesc, prometheus.GaugeValue, float64(st.Keys))
	ch <- prometheus.MustNewConstMetric(memBytesDesc, prometheus.GaugeValue, float64(st.Bytes))
	ch <- prometheus.MustNewConstMetric(memEvictionsDesc, prometheus.CounterValue, float64(st.Evictions))
	ch <- prometheus.MustNewConstMetric(memExpiredDesc, prometheus.CounterValue, float64(st.PermitsExpired))
}

// leaseCollector exports a lease store's counters as sluice_lease_*.
func leaseCollector(ls *lease.Store) prometheus.Collector {
	c := func(name, help string, v func(lease.Stats) int64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "sluice", Subsystem: "lease", Name: name, Help: help},
			func() float64 { return float64(v(ls.Stats())) })
	}
	return Collectors{
		c("local_hits_total", "Hits admitted from a lease, without a call to the store.", func(s lease.Stats) int64 { return s.Local }),
		c("grant_calls_total", "Grant calls made to the store.", func(s lease.Stats) int64 { return s.Grants }),
		c("grant_refused_total", "Grant calls the key or its ledger refused.", func(s lease.Stats) int64 { return s.Refused }),
		c("renewal_calls_total", "Grant calls made ahead, for a lease running low.", func(s lease.Stats) int64 { return s.Renewals }),
		c("granted_hits_total", "Hits granted to this node's leases.", func(s lease.Stats) int64 { return s.Granted }),
		c("expired_hits_total", "Hits granted that expired unspent.", func(s lease.Stats) int64 { return s.Expired }),
		c("store_hits_total", "Hits of leasing limits decided by the store.", func(s lease.Stats) int64 { return s.Fallback }),
	}
}

// regionCollector exports the region tier's counters as sluice_region_*.
func regionCollector(region string, rs *regions.Store) prometheus.Collector {
	labels := prometheus.Labels{"region": region}
	c := func(name, help string, f func(regions.Stats) int64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_region_" + name, Help: help, ConstLabels: labels},
			func() float64 { return float64(f(rs.Stats())) })
	}
	g := func(name, help string, f func(regions.Stats) float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_region_" + name, Help: help, ConstLabels: labels},
			func() float64 { return f(rs.Stats()) })
	}
	return Collectors{
		c("granted_hits_total", "Hits of global limits the coordinator granted this node's region, beyond its safe share.", func(s regions.Stats) int64 { return s.Granted }),
		c("given_back_hits_total", "Hits of global limits this node gave back to the coordinator.", func(s regions.Stats) int64 { return s.GivenBack }),
		c("ledger_errors_total", "Calls to the coordinator that failed.", func(s regions.Stats) int64 { return s.LedgerErrors }),
		c("counters_lost_total", "Global keys whose counters the region's Redis lost mid-window (restarted empty, flushed), charged again for what the region had left.", func(s regions.Stats) int64 { return s.Lost }),
		c("admitted_hits_total", "Hits of global limits admitted on this node.", func(s regions.Stats) int64 { return s.Admitted }),
		c("denied_hits_total", "Hits of global limits denied on this node (refusals).", func(s regions.Stats) int64 { return s.Denied }),
		g("allocation_hits", "This window's allocation of the global limits this node decided, as it knows it: the safe shares, plus its grants, less its give-backs.", func(s regions.Stats) float64 { return float64(s.Allocation) }),
		g("demand_hits_per_second", "Hits of global limits asked on this node per second, smoothed.", func(s regions.Stats) float64 { return float64(s.Demand) }),
		g("last_grant_timestamp_seconds", "When the coordinator last granted this node's region more (Unix seconds), 0 never.", func(s regions.Stats) float64 { return float64(s.LastGrant) / 1e9 }),
	}
}
