package dashboard

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/edges/hitters"
)

// NewCollector exports t's top key share per rule and kind
// (sluice_top_key_share, sluice_top_key_window_hits).
func NewCollector(t *hitters.Tracker) prometheus.Collector { return collector{t} }

// collector exports, per rule tracked (at most the tracker's
// MaxRules, so the labels stay bounded) and kind, the share of the last
// minute's hits that its top key made: an alert watches for one key
// suddenly taking most of a rule's denials. The keys themselves stay on
// /hitters and the dashboard, out of the metrics.
type collector struct{ t *hitters.Tracker }

var topShareDesc = prometheus.NewDesc("sluice_top_key_share",
	"Share of a rule's hits over the last minute made by its top key, by kind (requests, denials); the keys are on sluice serve's /hitters and the dashboard.",
	[]string{"rule", "kind"}, nil)

var windowHitsDesc = prometheus.NewDesc("sluice_top_key_window_hits",
	"Hits of a rule over the last minute, by kind, as the top keys count them.",
	[]string{"rule", "kind"}, nil)

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- topShareDesc
	ch <- windowHitsDesc
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	for _, rule := range c.t.Rules() {
		for kind, name := range map[hitters.Kind]string{hitters.Requests: "requests", hitters.Denials: "denials"} {
			top, total := c.t.Top(rule, kind, false, 1)
			share := 0.0
			if total > 0 && len(top) > 0 {
				share = min(1, float64(top[0].High)/float64(total))
			}
			ch <- prometheus.MustNewConstMetric(topShareDesc, prometheus.GaugeValue, share, rule, name)
			ch <- prometheus.MustNewConstMetric(windowHitsDesc, prometheus.GaugeValue, float64(total), rule, name)
		}
	}
}
