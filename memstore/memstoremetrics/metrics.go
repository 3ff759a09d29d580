// Package memstoremetrics exports the embedded store's figures
// ([memstore.Store.Stats]) to Prometheus, as the other stores export
// theirs with their Collector method. It is a package of its own so that
// memstore itself needs no dependency beyond its hash: a program that
// embeds the store without Prometheus does not link the client.
package memstoremetrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/memstore"
)

var (
	keysDesc = prometheus.NewDesc("sluice_store_keys",
		"Keys the embedded store holds state for.", nil, nil)
	bytesDesc = prometheus.NewDesc("sluice_store_bytes",
		"Estimated memory of the embedded store, which --max-bytes (memstore.Config.MaxBytes) caps.", nil, nil)
	evictionsDesc = prometheus.NewDesc("sluice_store_evictions_total",
		"Keys evicted to stay within --max-bytes (memstore.Config.MaxBytes).", nil, nil)
)

// Collector returns the metrics of s: sluice_store_keys and
// sluice_store_bytes (gauges) and sluice_store_evictions_total (a
// counter), read from one Stats call per scrape.
func Collector(s *memstore.Store) prometheus.Collector { return collector{s} }

type collector struct{ s *memstore.Store }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- keysDesc
	ch <- bytesDesc
	ch <- evictionsDesc
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	st := c.s.Stats()
	ch <- prometheus.MustNewConstMetric(keysDesc, prometheus.GaugeValue, float64(st.Keys))
	ch <- prometheus.MustNewConstMetric(bytesDesc, prometheus.GaugeValue, float64(st.Bytes))
	ch <- prometheus.MustNewConstMetric(evictionsDesc, prometheus.CounterValue, float64(st.Evictions))
}
