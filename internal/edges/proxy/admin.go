package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sluicehq/sluice/internal/decision/readiness"
	"github.com/sluicehq/sluice/internal/edges/dashboard"
	"github.com/sluicehq/sluice/internal/edges/hitters"
	"github.com/sluicehq/sluice/rules"
)

// AdminConfig configures AdminHandler. Every field is optional.
type AdminConfig struct {
	// StoreHealth is the store's health: nil when it can decide. Nil
	// means a store that is always up (the embedded one).
	StoreHealth func() error

	// Policy is the failure policy of the domains that set none: while
	// the store is down and it is fail_closed, every request would be
	// denied, so the proxy is not ready.
	Policy rules.FailurePolicy

	// Draining reports that the proxy is shutting down, which makes it
	// not ready, so that load balancers stop sending first. Nil means
	// never.
	Draining func() bool

	// Gatherer is served on /metrics (OpenMetrics when asked). Nil means
	// no /metrics.
	Gatherer prometheus.Gatherer

	// Hitters, when set, is the tracker of Config.Hitters: the live
	// dashboard is served at /dashboard (its data at /dashboard/data),
	// with each rule's allowed, denied and shadow-denied requests over
	// the last 10 minutes, its top offenders, the store's health, the
	// requests by result and where decisions were made.
	Hitters *hitters.Tracker

	// Domains, when set with Hitters, gives the domain in force (the
	// rules file's), for the dashboard to tell a rule's domain when it
	// has dots in it.
	Domains func() []string

	// HittersCluster, when set with Hitters, gives every node's top keys
	// (hitters.Shared's Snapshots, with --store redis): the dashboard's
	// offenders and near-limit lists are then the cluster's.
	HittersCluster func(ctx context.Context) ([]hitters.Snapshot, error)

	// Explain, when set with Hitters, reads what is left of a
	// descriptor's tightest limit without consuming it, for the
	// dashboard's list of keys near their limit.
	Explain func(ctx context.Context, domain string, descs []rules.Descriptor) (remaining, limit int64, ok bool)

	// InFlight, when set with Hitters, reads the permits the top keys of
	// a concurrency limit hold now, from the store, for the dashboard
	// (dashboard.HeldPermits).
	InFlight func(ctx context.Context, rule string, lists ...[]hitters.Item)

	// API, when set, is served under /v1/: the admin API, which checks
	// its own bearer tokens (sluice proxy serves explain there, as sluice
	// serve's --admin-addr does). Nil: no /v1/.
	API http.Handler

	// DashboardRemote serves the dashboard to clients other than the
	// loopback too. By default it answers only 127.0.0.1 and ::1 (a
	// browser on the node, or kubectl port-forward), since the admin
	// listener is often reachable by orchestrators and the dashboard
	// names keys: client addresses, users, API keys.
	DashboardRemote bool
}

// AdminHandler serves what operators and orchestrators ask a proxy,
// apart from the API's own paths: GET /healthz (the process answers),
// GET /readyz (200 "OK", or 503 "not ready: why" while draining, while
// the store has never been reached since start, or while it is down and
// the default policy is fail_closed), GET /metrics, with Hitters the
// dashboard at GET /dashboard, and with API the admin API under /v1/.
func AdminHandler(cfg AdminConfig) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "OK\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		var storeErr error
		if cfg.StoreHealth != nil {
			storeErr = cfg.StoreHealth()
		}
		err := readiness.Store(storeErr, cfg.Policy)
		if cfg.Draining != nil && cfg.Draining() {
			err = errors.New("draining")
		}
		if err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintf(w, "not ready: %v\n", err)
			return
		}
		io.WriteString(w, "OK\n")
	})
	if cfg.Gatherer != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(cfg.Gatherer, promhttp.HandlerOpts{EnableOpenMetrics: true}))
	}
	if cfg.Hitters != nil {
		dash := http.NewServeMux()
		dashboard.Register(dash, dashboard.Config{
			Title:          "sluice proxy",
			Tracker:        cfg.Hitters,
			Gatherer:       cfg.Gatherer,
			RequestsMetric: "sluice_proxy_requests_total",
			StoreHealth:    cfg.StoreHealth,
			Explain:        cfg.Explain,
			InFlight:       cfg.InFlight,
			Cluster:        cfg.HittersCluster,
			Domains:        cfg.Domains,
		})
		mux.Handle("/dashboard", localOnly(dash, cfg.DashboardRemote))
		mux.Handle("/dashboard/", localOnly(dash, cfg.DashboardRemote))
	}
	if cfg.API != nil {
		mux.Handle("/v1/", cfg.API)
	}
	return mux
}

// localOnly answers 403 to clients that are not on the loopback, unless
// remote is set.
func localOnly(h http.Handler, remote bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if a, ok := peerAddr(r.RemoteAddr); !remote && (!ok || !a.IsLoopback()) {
			http.Error(w, "the dashboard answers only the loopback (it names keys); run sluice proxy with --dashboard-remote to serve it to every client of --admin-listen", http.StatusForbidden)
			return
		}
		h.ServeHTTP(w, r)
	})
}
