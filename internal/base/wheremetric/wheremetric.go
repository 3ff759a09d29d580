// Package wheremetric is the one description of sluice_decisions_total,
// the requests decided by where the decision was made. Each part that
// decides (the Redis store, the local cache, the server's failure policy)
// exports its own series of it with a constant label, so that they
// describe it alike. It imports only Prometheus's client.
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
