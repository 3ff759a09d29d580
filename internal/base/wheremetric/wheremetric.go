// Package wheremetric is the one description of the metrics that several
// parts export a series of each, with a constant label, so that they
// describe them alike: sluice_decisions_total, the requests decided by
// where the decision was made (the Redis store, the local cache, the
// server's failure policy), and sluice_permits_expired_total, by the
// store that dropped the permits. It imports only Prometheus's client.
package wheremetric

import "github.com/prometheus/client_golang/prometheus"

// Name and Help of the metric.
const (
	Name = "sluice_decisions_total"
	Help = "Requests decided, by where the decision was made: redis (the Redis store), local_cache (the node-local cache of denied keys), policy (a failure policy, because the store could not decide; sluice_failure_policy_total says which and why)."
)

// Desc describes the series of where.
func Desc(where string) *prometheus.Desc {
	return prometheus.NewDesc(Name, Help, nil, prometheus.Labels{"where": where})
}

// Counter is a counter of the series of where.
func Counter(where string) prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{Name: Name, Help: Help, ConstLabels: prometheus.Labels{"where": where}})
}

// The permits a store dropped on expiry, exported alike by every store
// that holds permits (the Redis store, the embedded one, the local failure
// policy's), told apart by a constant label store.
const (
	PermitsExpiredName = "sluice_permits_expired_total"
	PermitsExpiredHelp = "Permits of concurrency limits the store dropped because they reached their TTL unreleased: their holders crashed, stalled past the TTL without renewing, or never released them. By store: redis, memory, local (the local failure policy's)."
)

// PermitsExpiredDesc describes the series of store.
func PermitsExpiredDesc(store string) *prometheus.Desc {
	return prometheus.NewDesc(PermitsExpiredName, PermitsExpiredHelp, nil, prometheus.Labels{"store": store})
}
