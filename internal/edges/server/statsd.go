package server

import (
	"context"
	"strings"
	"sync"
	"time"

	gostats "github.com/lyft/gostats"
	"google.golang.org/grpc"
)

// statsdStats are envoyproxy/ratelimit's stats, with its names, in a
// gostats store (the library it uses): under ratelimit.service, the
// per-rule counters rate_limit.<stats key>.total_hits, .over_limit,
// .near_limit, .within_limit and .shadow_mode; config_load_success,
// config_load_error and global_shadow_mode; rate_limit.<domain>.domain_not_found; and
// call.should_rate_limit.redis_error and .service_error.
type statsdStats struct {
	rateLimit                        gostats.Scope
	configLoadSuccess, configLoadErr gostats.Counter
	globalShadow                     gostats.Counter
	redisError, serviceError         gostats.Counter
}

func newStatsdStats(store gostats.Store, tags map[string]string) *statsdStats {
	svc := store.ScopeWithTags("ratelimit", tags).Scope("service")
	call := svc.Scope("call.should_rate_limit")
	return &statsdStats{
		rateLimit:         svc.Scope("rate_limit"),
		configLoadSuccess: svc.NewCounter("config_load_success"),
		configLoadErr:     svc.NewCounter("config_load_error"),
		globalShadow:      svc.NewCounter("global_shadow_mode"),
		redisError:        call.NewCounter("redis_error"),
		serviceError:      call.NewCounter("service_error"),
	}
}

// ruleStatsd are the statsd counters of one stats key.
type ruleStatsd struct {
	hits, within, over, near, shadow gostats.Counter
}

// rule returns the counters of a stats key, named as envoy-rl names them
// (sanitized).
func (s *statsdStats) rule(key string) *ruleStatsd {
	key = sanitize(key)
	return &ruleStatsd{
		hits:   s.rateLimit.NewCounter(key + ".total_hits"),
		within: s.rateLimit.NewCounter(key + ".within_limit"),
		over:   s.rateLimit.NewCounter(key + ".over_limit"),
		near:   s.rateLimit.NewCounter(key + ".near_limit"),
		shadow: s.rateLimit.NewCounter(key + ".shadow_mode"),
	}
}

// notFound returns the domain_not_found counter of a domain, named as
// envoy-rl names it.
func (s *statsdStats) notFound(domain string) gostats.Counter {
	return s.rateLimit.NewCounter(sanitize(domain) + ".domain_not_found")
}

// sanitize is envoy-rl's utils.SanitizeStatName: ':' and '|' become '_'.
func sanitize(name string) string { return statNameReplacer.Replace(name) }

var statNameReplacer = strings.NewReplacer(":", "_", "|", "_")

// StatsdInterceptor is envoy-rl's gRPC server reporter: every unary call
// counts ratelimit_server.<method>.total_requests and records its time in
// milliseconds as the timer ratelimit_server.<method>.response_time, in
// store, tagged with tags (EXTRA_TAGS). Give it to grpc.NewServer with
// grpc.ChainUnaryInterceptor when statsd is on.
func StatsdInterceptor(store gostats.Store, tags map[string]string) grpc.UnaryServerInterceptor {
	scope := store.ScopeWithTags("ratelimit_server", tags)
	var methods sync.Map // full method name -> *callStats
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		start := time.Now()
		v, ok := methods.Load(info.FullMethod)
		if !ok {
			// The method's name after its service's, as envoy-rl's
			// splitMethodName: "/pkg.Service/Method" is "Method".
			name := info.FullMethod[strings.LastIndexByte(info.FullMethod, '/')+1:]
			v, _ = methods.LoadOrStore(info.FullMethod, &callStats{
				total: scope.NewCounter(name + ".total_requests"),
				time:  scope.NewTimer(name + ".response_time"),
			})
		}
		cs := v.(*callStats)
		cs.total.Inc()
		resp, err := handler(ctx, req)
		cs.time.AddValue(float64(time.Since(start).Milliseconds()))
		return resp, err
	}
}

// callStats are the ratelimit_server stats of one gRPC method.
type callStats struct {
	total gostats.Counter
	time  gostats.Timer
}
