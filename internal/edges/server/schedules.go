package server

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/rules"
)

// scheduleWindows exports, at each scrape, which window of every rule with
// schedules is in force: sluice_schedule_window_active{domain, rule,
// window} is 1 for the window whose limits apply and 0 for the rule's other
// windows (all 0 while the rule's own limits apply). It costs nothing per
// request, and its series are as many as the rules' windows. An alert
// joins it with the per-rule counters to watch a rule during its quiet
// hours (deploy/prometheus).
type scheduleWindows struct {
	rules func() *rules.Config
	desc  *prometheus.Desc
}

func newScheduleWindows(cfg func() *rules.Config) *scheduleWindows {
	return &scheduleWindows{rules: cfg, desc: prometheus.NewDesc("sluice_schedule_window_active",
		"1 for the window of a rule's schedules whose limits apply now, 0 for its other windows.",
		[]string{"domain", "rule", "window"}, nil)}
}

func (c *scheduleWindows) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *scheduleWindows) Collect(ch chan<- prometheus.Metric) {
	cfg := c.rules()
	if cfg == nil {
		return
	}
	now := time.Now()
	for _, name := range cfg.Domains() {
		for _, r := range cfg.Domain(name).Rules {
			active := false
			for _, s := range r.Schedules {
				v := 0.0
				if in, _ := s.In(now); in && !active {
					active, v = true, 1
				}
				ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, v, name, r.StatKey, s.Name)
			}
		}
	}
}
