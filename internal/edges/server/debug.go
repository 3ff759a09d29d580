package server

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/pprof"
	"os"
	"strings"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/base/redact"
	"github.com/sluicehq/sluice/internal/edges/dashboard"
	"github.com/sluicehq/sluice/rules"
)

// DebugHandler serves what an operator inspects, on a listener of its own
// that should not be exposed (it names keys, and profiles the process):
//
//	/debug/pprof/...  the runtime profiles of net/http/pprof; its cmdline
//	                  with the secrets of the command line masked
//	                  (a Redis URL's password, --redis-password)
//	/rules            the loaded rules: Config.Rules's value, or the
//	                  decider's rules (domains, rules with their files and
//	                  line numbers, limits, the configuration hash) as JSON,
//	                  or as text with ?format=text
//	/hitters          the top keys of each rule
//	/dashboard        the live dashboard
//	/                 this list
func (s *Server) DebugHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", serveCmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	mux.HandleFunc("/rules", s.serveRules)
	mux.HandleFunc("/hitters", s.serveHitters)
	dashboard.Register(mux, s.dashboardConfig())
	mux.HandleFunc("/{$}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, "/debug/pprof/  runtime profiles\n/rules         the loaded rate limit rules (JSON; ?format=text for text)\n/hitters       the top keys of each rule, by requests and denials (?rule=, ?kind=, ?window=minute|hour, ?k=)\n/dashboard     the live dashboard\n")
	})
	return mux
}

// serveCmdline answers as pprof.Cmdline does, the arguments of the
// process separated by NUL bytes, with their secrets masked
// (redact.Args): the command line must not hand a Redis password to
// whoever reaches the debug listener.
func serveCmdline(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	io.WriteString(w, strings.Join(redact.Args(os.Args), "\x00"))
}

func (s *Server) serveRules(w http.ResponseWriter, r *http.Request) {
	text := r.URL.Query().Get("format") == "text"
	var v any
	if s.rulesDebug != nil {
		v = s.rulesDebug()
	} else {
		cfg := s.dec.Rules()
		if cfg == nil {
			writeError(w, http.StatusServiceUnavailable, errNoConfig.Error())
			return
		}
		var at time.Time
		if li := s.loaded.Load(); li != nil && li.cfg == cfg {
			at = li.at
		}
		sum := summarize(cfg, at)
		if text {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			sum.writeText(w)
			return
		}
		v = sum
	}
	switch t := v.(type) {
	case string:
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, t)
	case fmt.Stringer:
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, t.String())
	default:
		body, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			writeError(w, http.StatusInternalServerError, "encoding the rules: "+err.Error())
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(append(body, '\n'))
	}
}

// RulesSummary describes a loaded configuration for the debug handler.
type RulesSummary struct {
	Hash     string          `json:"hash"`
	LoadedAt *time.Time      `json:"loaded_at,omitempty"`
	Domains  []DomainSummary `json:"domains"`
	Warnings []string        `json:"warnings,omitempty"`
}

// DomainSummary describes one domain of a configuration.
type DomainSummary struct {
	Name     string        `json:"name"`
	File     string        `json:"file"`
	Capacity *LimitSummary `json:"capacity,omitempty"`
	// FailurePolicy is the domain's failure_policy, empty when it sets
	// none (the server's default applies).
	FailurePolicy string        `json:"failure_policy,omitempty"`
	Rules         []RuleSummary `json:"rules"`
}

// RuleSummary describes one rule (descriptor) of a domain.
type RuleSummary struct {
	StatKey        string         `json:"stat_key"`
	Key            string         `json:"key"`
	Value          string         `json:"value,omitempty"`
	Line           int            `json:"line"`
	Column         int            `json:"column"`
	Name           string         `json:"name,omitempty"`
	Replaces       []string       `json:"replaces,omitempty"`
	Unlimited      bool           `json:"unlimited,omitempty"`
	ShadowMode     bool           `json:"shadow_mode,omitempty"`
	DetailedMetric bool           `json:"detailed_metric,omitempty"`
	Limits         []LimitSummary `json:"limits,omitempty"`
}

// LimitSummary describes one compiled limit.
type LimitSummary struct {
	Name           string `json:"name"`
	Algorithm      string `json:"algorithm"`
	Rate           int64  `json:"requests_per_period"`
	Period         string `json:"period"`
	Burst          int64  `json:"burst,omitempty"`
	RefillInterval string `json:"refill_interval,omitempty"`
	SoftPercent    int    `json:"soft_percent,omitempty"`
	ElasticCeiling int64  `json:"elastic_ceiling,omitempty"`
	BlockFor       string `json:"block_for,omitempty"`
	Debit          bool   `json:"debit,omitempty"`
	LeaseOvershoot int64  `json:"lease_overshoot,omitempty"`
}

func summarize(cfg *rules.Config, at time.Time) *RulesSummary {
	sum := &RulesSummary{Hash: cfg.Hash(), Domains: []DomainSummary{}}
	if !at.IsZero() {
		at := at.UTC()
		sum.LoadedAt = &at
	}
	for _, name := range cfg.Domains() {
		d := cfg.Domain(name)
		ds := DomainSummary{Name: d.Name, File: d.File, Rules: []RuleSummary{}}
		if d.Capacity != nil {
			ls := summarizeLimit(d.Capacity)
			ds.Capacity = &ls
		}
		if d.FailurePolicy != rules.FailDefault {
			ds.FailurePolicy = d.FailurePolicy.String()
		}
		for _, r := range d.Rules {
			rs := RuleSummary{
				StatKey: r.StatKey, Key: r.Key, Value: r.Value, Line: r.Line, Column: r.Column,
				Name: r.Name, Replaces: r.Replaces, Unlimited: r.Unlimited,
				ShadowMode: r.ShadowMode, DetailedMetric: r.DetailedMetric,
			}
			for _, l := range r.Limits {
				rs.Limits = append(rs.Limits, summarizeLimit(l))
			}
			ds.Rules = append(ds.Rules, rs)
		}
		sum.Domains = append(sum.Domains, ds)
	}
	for _, p := range cfg.Warnings() {
		sum.Warnings = append(sum.Warnings, p.String())
	}
	return sum
}

func summarizeLimit(l *sluice.Limit) LimitSummary {
	ls := LimitSummary{
		Name: l.Name, Algorithm: l.Algorithm.String(), Rate: l.Rate, Period: l.Period.String(),
		Burst: l.Burst, SoftPercent: l.SoftPercent, ElasticCeiling: l.ElasticCeiling, Debit: l.Debit,
		LeaseOvershoot: l.LeaseOvershoot,
	}
	if l.RefillInterval > 0 {
		ls.RefillInterval = l.RefillInterval.String()
	}
	if l.BlockFor > 0 {
		ls.BlockFor = l.BlockFor.String()
	}
	return ls
}

func (sum *RulesSummary) writeText(w io.Writer) {
	b := bufio.NewWriter(w)
	fmt.Fprintf(b, "config %s", sum.Hash)
	if sum.LoadedAt != nil {
		fmt.Fprintf(b, " loaded %s", sum.LoadedAt.Format(time.RFC3339))
	}
	b.WriteByte('\n')
	for _, d := range sum.Domains {
		fmt.Fprintf(b, "\ndomain %s (%s)\n", d.Name, d.File)
		if d.Capacity != nil {
			fmt.Fprintf(b, "  capacity: %s\n", d.Capacity.text())
		}
		if d.FailurePolicy != "" {
			fmt.Fprintf(b, "  failure_policy: %s\n", d.FailurePolicy)
		}
		for _, r := range d.Rules {
			fmt.Fprintf(b, "  %s:%d: %s", d.File, r.Line, r.StatKey)
			var flags []string
			if r.Name != "" {
				flags = append(flags, "name="+r.Name)
			}
			if len(r.Replaces) > 0 {
				flags = append(flags, "replaces="+strings.Join(r.Replaces, ","))
			}
			if r.Unlimited {
				flags = append(flags, "unlimited")
			}
			if r.ShadowMode {
				flags = append(flags, "shadow_mode")
			}
			if r.DetailedMetric {
				flags = append(flags, "detailed_metric")
			}
			if len(flags) > 0 {
				fmt.Fprintf(b, " [%s]", strings.Join(flags, " "))
			}
			b.WriteByte('\n')
			for _, l := range r.Limits {
				fmt.Fprintf(b, "    %s\n", l.text())
			}
		}
	}
	if len(sum.Warnings) > 0 {
		b.WriteString("\nwarnings:\n")
		for _, w := range sum.Warnings {
			fmt.Fprintf(b, "  %s\n", w)
		}
	}
	b.Flush()
}

func (l *LimitSummary) text() string {
	s := fmt.Sprintf("%d per %s %s", l.Rate, l.Period, l.Algorithm)
	if l.Burst > 0 {
		s += fmt.Sprintf(" burst=%d", l.Burst)
	}
	if l.RefillInterval != "" {
		s += " refill_interval=" + l.RefillInterval
	}
	if l.SoftPercent > 0 {
		s += fmt.Sprintf(" soft_percent=%d", l.SoftPercent)
	}
	if l.ElasticCeiling > 0 {
		s += fmt.Sprintf(" elastic_ceiling=%d", l.ElasticCeiling)
	}
	if l.BlockFor != "" {
		s += " block_for=" + l.BlockFor
	}
	if l.Debit {
		s += " debit"
	}
	if l.LeaseOvershoot > 0 {
		s += fmt.Sprintf(" lease_overshoot=%d", l.LeaseOvershoot)
	}
	return s
}
