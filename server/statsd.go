package server

import (
	"strings"

	gostats "github.com/lyft/gostats"
)

// statsdStats are envoyproxy/ratelimit's stats, with its names, in a
// gostats store (the library it uses): under ratelimit.service, the
// per-rule counters rate_limit.<stats key>.total_hits, .over_limit,
// .near_limit, .within_limit and .shadow_mode; config_load_success,
// config_load_error and global_shadow_mode; and
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
// (its utils.SanitizeStatName: ':' and '|' become '_').
func (s *statsdStats) rule(key string) *ruleStatsd {
	key = strings.NewReplacer(":", "_", "|", "_").Replace(key)
	return &ruleStatsd{
		hits:   s.rateLimit.NewCounter(key + ".total_hits"),
		within: s.rateLimit.NewCounter(key + ".within_limit"),
		over:   s.rateLimit.NewCounter(key + ".over_limit"),
		near:   s.rateLimit.NewCounter(key + ".near_limit"),
		shadow: s.rateLimit.NewCounter(key + ".shadow_mode"),
	}
}
