#!/usr/bin/env bash
# redis.sh measures sluice serve on Redis against the embedded store
# (docs/benchmarks.md; the history in docs/internals/benchmarks-journal.md):
# the same load from sluice bench, on the same machine,
# against two sluice serve processes that differ only in their store,
# --store memory and --store redis (with its local cache of over-limit keys,
# on by default), in alternating rounds.
#
#   bench/redis.sh        # ROUNDS=5 DURATION=10s WARMUP=2s CONNECTIONS=2
#                         # CONCURRENCY=32 MODE=grpc SCENARIOS="10k hot hot10"
#   bench/redis.sh summary bench/results/DATE-redis.jsonl   # the tables again
#
# Needs redis-server and redis-cli on the PATH (Debian: apt-get install
# redis-server), jq, curl and /usr/bin/time; LUA=1 also redis-benchmark.
# Scenarios are those of bench/serve.sh (every request one descriptor
# {key: <value>} in domain bench):
#   10k    10,000 keys, chosen uniformly, all within their limit
#   hot    every request on the one key "hot", which is over its limit
#   hot10  10% of the requests on "hot", the rest over 10,000 keys
#   1m     1,000,000 keys, all filled into both stores before the rounds
#
# It starts its own redis-server (no persistence) and the two servers on
# free 127.0.0.1 ports, sends each 3 s of untimed load (so that Redis has
# compiled the store's Lua and both are warm), then runs every scenario
# ROUNDS times against both, memory first in odd rounds and redis first in
# even ones, so that a burst of someone else's load on this shared machine
# spreads over both. Both servers run the whole time (one idle while the
# other is measured). Every process it starts is stopped on exit, failure
# included (after the run in progress, when interrupted).
#
# Per run it records, besides sluice bench's figures: the CPU time of the
# sluice serve process and of the load generator per request (from
# /proc/PID/stat and /usr/bin/time); and of Redis, from INFO cpu
# (used_cpu_user + used_cpu_sys, read before and after the run) and, as a
# cross-check, from the redis-server's /proc/PID/stat; the Redis store's
# calls (sluice_redis_calls_total by result, from /metrics: each ok call is
# one script call, FCALL) and the local cache's hits; INFO commandstats's
# fcall (and evalsha, for older builds) calls and microseconds, and the
# socket reads Redis processed (fewer than calls when the client
# pipelines). Redis CPU is given per 1,000 calls (the decisions that
# reached Redis) and per 1,000 requests served (some of which the local
# cache answered). Counters cover the warm-up too, as does the CPU time.
#
# Writes bench/results/DATE-redis.jsonl (one line per run),
# DATE-redis-machine.txt (machine, versions, load average before each run,
# RSS, Redis's slowlog and latency monitor, the store's call durations) and
# DATE-redis.md (the tables of summarize below).
#
# NAME (default redis) names the result files, for side runs;
# REDIS_SERVE_FLAGS are extra flags of the redis-backed sluice serve only
# (e.g. "--local-cache-size 0", "--redis-timeout 1s").
# B_REV (a git revision) and B_TAGS (Go build tags) add a third server,
# redis-b: sluice serve --store redis built from that revision (default:
# this tree) with those tags, with the same flags and keys of its own
# (--redis-prefix sluice-b:), on the same Redis, in the same alternating
# rounds; the tables then compare redis-b with redis (this tree), e.g.
# B_REV=main for a change's before and after, or B_TAGS=sluice_exactlua
# for the store without its Lua fast path (redisstore/internal/luasrc).
# SERVERS chooses the servers (default "memory redis", and redis-b when
# set), in the order of odd rounds (even rounds reverse it), e.g.
# SERVERS="redis redis-b"; memory-b is B_REV's build on the embedded
# store, to compare "memory" before and after a change the same way.
# PROFILE=1 also takes, after each scenario's rounds, a 10 s CPU profile of
# the redis-backed sluice serve under that scenario's load
# (DATE-NAME-cpu-SCENARIO.pprof, summarised in .txt) with Redis's INFO
# commandstats and cpu over the same 10 s (DATE-NAME-cmdstat-SCENARIO.txt).
# LUA=1 also measures one decision inside Redis with redis-benchmark: the
# store's own call (captured with MONITOR, replayed) against the same Lua
# run as a plain script (EVALSHA) with and without the decision, and an
# empty script; then the Lua operations of that decision one by one
# (DATE-NAME-lua.txt).
set -euo pipefail
cd "$(dirname "$0")/.."

# summarize prints the tables of DATE-redis.md from a jsonl file: medians
# across rounds per scenario and server, redis over memory, Redis's cost per
# call, every round's throughputs, and with redis-b, redis-b against redis. CPU per request adds up the sluice
# serve process, the load generator and (for redis) Redis, per request
# served: Redis CPU in ms per 1,000 requests is µs per request. "Net of
# idle" takes off what Redis used in the memory runs of the same scenario
# (serverCron and the like, about 2 ms a second), which matters when few
# calls reach it (hot).
summarize() { # file.jsonl
	jq -s -r '
	def median: map(select(. != null)) | sort | if length == 0 then null elif length % 2 == 1 then .[length / 2 | floor] else (.[length / 2 - 1] + .[length / 2]) / 2 end;
	def r(n): if . == null then "–" else . * n | round / n end;
	def med(f): map(f) | median;
	def total: .server_cpu_us_per_req + .gen_cpu_us_per_req + (if (.server | startswith("memory") | not) then .redis_cpu_ms_per_1k_req else 0 end);
	def row($idle): {rps: med(.rps), p50: med(.p50_us), p99: med(.p99_us), p999: med(.p999_us),
		cpu: med(.server_cpu_us_per_req), gen: med(.gen_cpu_us_per_req), total: med(total),
		rcpu_call: med(.redis_cpu_ms_per_1k_calls), rcpu_req: med(.redis_cpu_ms_per_1k_req),
		rcpu_net: med(if (.redis_calls // 0) > 0 and $idle != null then (.redis_cpu_ms - $idle) / .redis_calls * 1e3 else null end),
		rproc_call: med(.redis_proc_cpu_ms_per_1k_calls), rproc_req: med(.redis_proc_cpu_ms_per_1k_req),
		calls_req: med(.redis_calls_per_req),
		script_us: med(.script_us_per_call), reads_call: med(.redis_reads_per_call),
		ok: (map(.ok) | add), over: (map(.over_limit) | add), errors: (map(.errors) | add),
		store_errors: (map((.redis_call_errors // 0) + (.redis_calls_rejected // 0)) | add),
		store_error_rounds: (map(select((.redis_call_errors // 0) + (.redis_calls_rejected // 0) > 0)) | length)};
	(group_by(.scenario) | map(
		(map(select((.server | startswith("memory")))) | med(.redis_cpu_ms)) as $idle |
		{scenario: .[0].scenario, rounds: (map(.round) | unique | length),
		 by: (group_by(.server) | map({key: .[0].server, value: row($idle)}) | from_entries)})) as $s |
	($s | map(select(.by.memory and .by.redis))) as $mr |
	($s | map(select(.by.redis and .by["redis-b"]))) as $rb |
	(["| scenario | server | req/s | p50 µs | p99 µs | p99.9 µs | sluice CPU µs/req | generator CPU µs/req | Redis CPU µs/req | all CPU µs/req |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"] +
	 ($s | map(.scenario as $sc | .by | to_entries[] |
		"| \($sc) | \(.key) | \(.value.rps | round) | \(.value.p50 | r(1)) | \(.value.p99 | r(1)) | \(.value.p999 | r(1)) | \(.value.cpu | r(10)) | \(.value.gen | r(10)) | \(if (.key | startswith("memory")) then "–" else .value.rcpu_req | r(10) end) | \(.value.total | r(10)) |")) +
	 (if ($mr | length) == 0 then [] else
	 ["", "| scenario | rounds | redis/memory req/s (target ≥ 0.80; hot ≥ 0.95) | redis/memory p99 | redis/memory sluice CPU per request | memory/redis all CPU per request | redis ok / over limit / errors | store errors + rejected (rounds) |", "|---|---:|---:|---:|---:|---:|---|---:|"] +
	 ($mr | map(.by.memory as $m | .by.redis as $r |
		"| \(.scenario) | \(.rounds) | \($r.rps / $m.rps | r(100)) | \($r.p99 / $m.p99 | r(100)) | \($r.cpu / $m.cpu | r(100)) | \($m.total / $r.total | r(100)) | \($r.ok) / \($r.over) / \($r.errors) | \($r.store_errors) (\($r.store_error_rounds)) |")) end) +
	 ["", "| scenario | server | Redis calls per request | Redis CPU ms per 1k calls (INFO) | same from /proc | same, net of idle | Redis CPU ms per 1k requests | same from /proc | script µs per call (commandstats, in-command) | Redis socket reads per call |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"] +
	 ($s | map(.scenario as $sc | .by | to_entries[] | select((.key | startswith("memory") | not)) |
		"| \($sc) | \(.key) | \(.value.calls_req | r(1000)) | \(.value.rcpu_call | r(100)) | \(.value.rproc_call | r(100)) | \(.value.rcpu_net | r(100)) | \(.value.rcpu_req | r(100)) | \(.value.rproc_req | r(100)) | \(.value.script_us | r(100)) | \(.value.reads_call | r(1000)) |")) +
	 (if ($rb | length) == 0 then [] else
	 ["", "| scenario | rounds | redis req/s | redis-b req/s | redis/redis-b req/s | redis Redis CPU µs/req | redis-b Redis CPU µs/req | redis-b/redis Redis CPU per request | redis ok / over / errors | redis-b ok / over / errors |", "|---|---:|---:|---:|---:|---:|---:|---:|---|---|"] +
	 ($rb | map(.by.redis as $r | .by["redis-b"] as $b |
		"| \(.scenario) | \(.rounds) | \($r.rps | round) | \($b.rps | round) | \($r.rps / $b.rps | r(100)) | \($r.rcpu_req | r(100)) | \($b.rcpu_req | r(100)) | \($b.rcpu_req / $r.rcpu_req | r(100)) | \($r.ok) / \($r.over) / \($r.errors) | \($b.ok) / \($b.over) / \($b.errors) |")) end) +
	 ["", "| scenario | round | server | req/s | Redis CPU µs/req | redis-b/redis or redis/memory req/s |", "|---|---:|---|---:|---:|---:|"] +
	 (group_by(.scenario) | map(group_by(.round) | map(
		(map(select((.server | startswith("memory"))))[0]) as $m | (map(select(.server == "redis"))[0]) as $r |
		(map(select(.server == "redis-b"))[0]) as $b |
		sort_by(.server) | .[] |
		"| \(.scenario) | \(.round) | \(.server) | \(.rps | round) | \(if (.server | startswith("memory")) then "–" else .redis_cpu_ms_per_1k_req | r(100) end) | \(
			if .server == "redis-b" and $r != null then .rps / $r.rps | r(100)
			elif .server == "redis" and $m != null then .rps / $m.rps | r(100)
			else "" end) |")) | flatten)) |
	.[]' "$1"
}

# bench/redis.sh summary FILE.jsonl: only print the tables of a past run.
if [ "${1:-}" = summary ]; then
	summarize "$2"
	exit
fi

rounds=${ROUNDS:-5}
duration=${DURATION:-10s}
warmup=${WARMUP:-2s}
connections=${CONNECTIONS:-2}
concurrency=${CONCURRENCY:-32}
mode=${MODE:-grpc}
scenarios=${SCENARIOS:-10k hot hot10}
profile=${PROFILE:-0}
lua=${LUA:-0}
name=${NAME:-redis}
redis_serve_flags=${REDIS_SERVE_FLAGS:-}
b_rev=${B_REV:-}
b_tags=${B_TAGS:-}
servers=${SERVERS:-memory redis${b_rev:+ redis-b}}
if [ -z "${SERVERS:-}" ] && [ -z "$b_rev" ] && [ -n "$b_tags" ]; then
	servers="memory redis redis-b"
fi
# redis_servers are the redis-backed ones; the first is the one whose
# metrics a memory run reads (idle), and PROFILE=1's.
redis_servers=$(tr ' ' '\n' <<<"$servers" | grep -v '^memory' | paste -sd' ' || true)
if [ -z "$redis_servers" ]; then
	echo "redis.sh: SERVERS=\"$servers\" has no redis-backed server" >&2
	exit 2
fi
first_redis=${redis_servers%% *}

for c in redis-server redis-cli jq curl /usr/bin/time; do
	command -v "$c" >/dev/null || {
		echo "redis.sh: $c not found" >&2
		exit 1
	}
done
if [ "$lua" = 1 ]; then
	command -v redis-benchmark >/dev/null || {
		echo "redis.sh: LUA=1 needs redis-benchmark" >&2
		exit 1
	}
fi

# shellcheck source=bench/lib.sh
. bench/lib.sh
bench_setup "$name"
trap 'exit 130' INT TERM

# bin_b is the sluice of redis-b: B_REV's tree (exported with git
# archive, not checked out) or this one, built with B_TAGS.
declare -A bin_of=([memory]=$bin [redis]=$bin)
if [[ " $servers " == *" redis-b "* || " $servers " == *" memory-b "* ]]; then
	bin_b=$work/sluice-b
	if [ -n "$b_rev" ]; then
		mkdir "$work/b"
		git archive "$b_rev" | tar -x -C "$work/b"
		(cd "$work/b" && go build -tags "$b_tags" -o "$bin_b" ./cmd/sluice)
	else
		go build -tags "$b_tags" -o "$bin_b" ./cmd/sluice
	fi
	bin_of[redis-b]=$bin_b
	bin_of[memory-b]=$bin_b
fi

# free_port prints a TCP port that no socket uses, not one it gave before,
# below the range the kernel picks outgoing ports from (so that a client's
# connection cannot take it before the server binds it).
given=" "
ephemeral=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range)
free_port() {
	local p
	while :; do
		p=$((10000 + RANDOM % (ephemeral - 10000)))
		case "$given" in *" $p "*) continue ;; esac
		if ! ss -Htan "sport = :$p" | grep -q .; then
			given="$given$p "
			echo "$p"
			return
		fi
	done
}

redis_port=$(free_port)
declare -A grpc_addr http_addr debug_addr pid_of
for s in $servers; do
	grpc_addr[$s]=127.0.0.1:$(free_port)
	http_addr[$s]=127.0.0.1:$(free_port)
	debug_addr[$s]=127.0.0.1:$(free_port)
done

redis-server --bind 127.0.0.1 --port "$redis_port" --save "" --appendonly no \
	--latency-monitor-threshold 10 --dir "$work" --logfile "$work/redis.log" &
redis_pid=$!
pids+=("$redis_pid")
rcli() { redis-cli -p "$redis_port" "$@"; }
for _ in $(seq 100); do
	rcli ping >/dev/null 2>&1 && break
	sleep 0.1
done
rcli ping >/dev/null 2>&1 || {
	echo "redis.sh: redis-server on port $redis_port not answering" >&2
	cat "$work/redis.log" >&2
	exit 1
}

store_flags() { # server
	case "$1" in
	memory | memory-b) echo "--store memory" ;;
	redis) echo "--store redis --redis-url redis://127.0.0.1:$redis_port${redis_serve_flags:+ $redis_serve_flags}" ;;
	redis-b) echo "--store redis --redis-url redis://127.0.0.1:$redis_port --redis-prefix sluice-b:${redis_serve_flags:+ $redis_serve_flags}" ;;
	esac
}
for s in $servers; do
	# shellcheck disable=SC2046
	"${bin_of[$s]}" serve --config "$work/rules.yaml" $(store_flags "$s") --grpc-addr "${grpc_addr[$s]}" \
		--http-addr "${http_addr[$s]}" --debug-addr "${debug_addr[$s]}" --log-format json \
		2>"$work/serve-$s.log" &
	pid_of[$s]=$!
	pids+=("${pid_of[$s]}")
done

for s in $servers; do
	ready "http://${http_addr[$s]}/readyz" "$work"/serve-*.log "$work/redis.log"
done

rss() { # label
	local s
	for s in $servers; do
		echo "$1: sluice serve --store $s VmRSS $(awk '/VmRSS/ {print $2, $3}' "/proc/${pid_of[$s]}/status")"
	done
	echo "$1: redis-server VmRSS $(awk '/VmRSS/ {print $2, $3}' "/proc/$redis_pid/status"), used_memory $(rcli info memory | awk -F: '/^used_memory:/ {print $2}' | tr -d '\r') B, keys $(rcli dbsize)"
}
{
	machine_facts
	redis-server --version
	echo "rueidis: $(go list -m github.com/redis/rueidis 2>/dev/null || echo unknown)"
	echo "mode $mode, $connections connection(s), $concurrency in flight, warmup $warmup, duration $duration, $rounds rounds"
	for s in $servers; do
		echo "sluice serve ($s) flags: $(store_flags "$s" | sed "s/$redis_port/PORT/"), pid ${pid_of[$s]}"
	done
	if [ -n "${bin_b:-}" ]; then
		echo "redis-b: sluice built from ${b_rev:-this tree} ($(git rev-parse "${b_rev:-HEAD}")) with tags \"$b_tags\""
	fi
	echo "redis-server on 127.0.0.1:$redis_port, pid $redis_pid"
	loadavg "start"
	rss "start"
} >"$out-machine.txt"

target() { # server
	case "$mode" in
	grpc) echo "${grpc_addr[$1]}" ;;
	json) echo "${http_addr[$1]}" ;;
	esac
}

# counters SERVER prints, as one JSON object, every counter a run is
# measured by: the store and cache metrics of SERVER (of the first
# redis-backed server for memory), and Redis's own.
counters() {
	local info m=$1
	if [ "$m" = memory ]; then
		m=$first_redis
	fi
	info=$(rcli info everything | tr -d '\r')
	{
		curl -fsS "http://${http_addr[$m]}/metrics" |
			awk '/^sluice_redis_calls_total\{result="(ok|error|rejected)"\}/ {
				sub(/.*result="/, "", $1); sub(/"\}/, "", $1); print "calls_" $1, $2 }
			/^sluice_local_cache_(hits|misses)_total / {
				sub(/^sluice_local_cache_/, "", $1); sub(/_total$/, "", $1); print "cache_" $1, $2 }'
		awk -F'[:,=]' '/^used_cpu_(user|sys):/ {print $1, $2}
			/^cmdstat_(fcall|evalsha|eval):/ {sub(/^cmdstat_/, "", $1); print $1 "_calls", $3; print $1 "_usec", $5}
			/^total_reads_processed:/ {print "reads", $2}' <<<"$info"
		echo "redis_ticks $(cpu_ticks "$redis_pid")"
	} | jq -R -n '[inputs | split(" ") | {(.[0]): (.[1] | tonumber)}] | add
		| {fcall_calls: 0, fcall_usec: 0, evalsha_calls: 0, evalsha_usec: 0, eval_calls: 0, eval_usec: 0} + .'
}

bench() { # server scenario round [extra flags]
	local server=$1 scenario=$2 round=$3 pid before after ticks
	shift 3
	pid=${pid_of[$server]}
	before=$(counters "$server")
	ticks=$(cpu_ticks "$pid")
	# shellcheck disable=SC2046
	/usr/bin/time -f '%U %S' -o "$work/gen.time" \
		"$bin" bench --json --mode "$mode" --target "$(target "$server")" \
		--connections "$connections" --concurrency "$concurrency" \
		--warmup "$warmup" --duration "$duration" $(rls_flags "$scenario") "$@" >"$work/run.json"
	ticks=$(($(cpu_ticks "$pid") - ticks))
	after=$(counters "$server")
	# CPU over the whole run (warm-up included) per request answered: the
	# server's, the generator's and Redis's. The Redis figures of a memory
	# run are Redis idling, for reference.
	jq -c --arg scenario "$scenario" --arg server "$server" --argjson round "$round" \
		--argjson ticks "$ticks" --argjson hz "$(getconf CLK_TCK)" \
		--argjson gen "$(awk '{print $1 + $2}' "$work/gen.time")" \
		--argjson b "$before" --argjson a "$after" \
		'(.requests + .warmup_requests) as $n |
		 ($a | with_entries(.value -= ($b[.key] // 0))) as $d |
		 (($d.used_cpu_user + $d.used_cpu_sys) * 1e3) as $rcpu |
		 ($d.redis_ticks / $hz * 1e3) as $rproc |
		 {scenario: $scenario, server: $server, round: $round} + . +
		 {server_cpu_us_per_req: ($ticks / $hz * 1e6 / $n),
		  gen_cpu_us_per_req: ($gen * 1e6 / $n),
		  redis_cpu_ms: $rcpu, redis_proc_cpu_ms: $rproc,
		  redis_calls: $d.calls_ok, redis_call_errors: $d.calls_error, redis_calls_rejected: $d.calls_rejected,
		  cache_hits: $d.cache_hits, cache_misses: $d.cache_misses,
		  fcall_calls: $d.fcall_calls, evalsha_calls: $d.evalsha_calls, eval_calls: $d.eval_calls, redis_reads: $d.reads,
		  script_us_per_call: (($d.fcall_calls + $d.evalsha_calls) as $c |
			if $c > 0 then ($d.fcall_usec + $d.evalsha_usec) / $c else null end)} +
		 if ($server | startswith("memory") | not) then
		 {redis_calls_per_req: ($d.calls_ok / $n),
		  redis_cpu_ms_per_1k_calls: (if $d.calls_ok > 0 then $rcpu / $d.calls_ok * 1e3 else null end),
		  redis_cpu_ms_per_1k_req: ($rcpu / $n * 1e3),
		  redis_proc_cpu_ms_per_1k_calls: (if $d.calls_ok > 0 then $rproc / $d.calls_ok * 1e3 else null end),
		  redis_proc_cpu_ms_per_1k_req: ($rproc / $n * 1e3),
		  redis_reads_per_call: (if $d.calls_ok > 0 then $d.reads / $d.calls_ok else null end)}
		 else {} end' "$work/run.json"
}

summary() { # the one-line summary of a jsonl line
	jq -r '"\(.scenario) round \(.round) \(.server): \(.rps|floor) req/s p50 \(.p50_us)µs p99 \(.p99_us)µs ok \(.ok) over \(.over_limit) errors \(.errors) sluice cpu \(.server_cpu_us_per_req*10|floor/10)µs/req redis cpu \(.redis_cpu_ms|floor)ms" +
		(if (.server | startswith("memory") | not) then " = \(.redis_cpu_ms_per_1k_calls // 0 | .*100|floor/100)ms/1k calls, \(.redis_calls_per_req*1000|floor/1000) calls/req, cache hits \(.cache_hits), store errors \(.redis_call_errors)+\(.redis_calls_rejected)" else "" end)'
}

# Warm both servers up, untimed: Redis compiles the store's Lua on first
# use, and connections and caches fill.
for s in $servers; do
	"$bin" bench --mode "$mode" --target "$(target "$s")" --connections "$connections" \
		--concurrency "$concurrency" --keys 10000 --warmup 0 --duration 3s >/dev/null
done
{
	for s in $redis_servers; do
		echo "after the untimed warm-up, $s: $(curl -fsS "http://${http_addr[$s]}/metrics" | grep -E '^sluice_redis_calls_total' | tr '\n' ' ')"
	done
	echo "Redis commandstats: $(rcli info commandstats | grep -E 'cmdstat_(eval|fcall|function)' | tr -d '\r' | tr '\n' ' ')"
} >>"$out-machine.txt"

: >"$out.jsonl"
for scenario in $scenarios; do
	if [ "$scenario" = 1m ]; then
		rss "before filling 1M keys" >>"$out-machine.txt"
		for s in $servers; do
			"$bin" bench --mode "$mode" --target "$(target "$s")" --connections "$connections" \
				--concurrency "$concurrency" --keys 1000000 --fill --warmup 0 --duration 0 --requests 1 \
				>>"$out-machine.txt"
		done
		rss "after filling 1M keys" >>"$out-machine.txt"
	fi
	for round in $(seq "$rounds"); do
		order=$servers
		if [ $((round % 2)) = 0 ]; then
			order=$(tr ' ' '\n' <<<"$servers" | tac | paste -sd' ')
		fi
		for server in $order; do
			loadavg "$scenario round $round $server" >>"$out-machine.txt"
			bench "$server" "$scenario" "$round" | tee -a "$out.jsonl" | summary
		done
	done
	if [ "$profile" = 1 ]; then
		bench "$first_redis" "$scenario" 0 --duration 14s >"$work/profile.json" &
		bench_pid=$!
		sleep 3
		rcli info commandstats | tr -d '\r' >"$work/cmdstat.before"
		rcli info cpu | tr -d '\r' >"$work/cpu.before"
		curl -fsS -o "$out-cpu-$scenario.pprof" "http://${debug_addr[$first_redis]}/debug/pprof/profile?seconds=10"
		rcli info commandstats | tr -d '\r' >"$work/cmdstat.after"
		rcli info cpu | tr -d '\r' >"$work/cpu.after"
		wait "$bench_pid"
		{
			echo "Redis over the 10 s of the profile of sluice serve --store redis, scenario $scenario"
			echo "(commandstats and cpu deltas; usec is time inside the command, a script's inner calls included in its fcall)"
			for f in cmdstat cpu; do
				paste -d' ' <(grep -E '^(cmdstat_|used_cpu)' "$work/$f.before") <(grep -E '^(cmdstat_|used_cpu)' "$work/$f.after")
			done | awk '{
				split($1, b, /[:,=]/); split($2, a, /[:,=]/)
				if (b[1] ~ /^cmdstat_/) {
					calls = a[3] - b[3]; usec = a[5] - b[5]
					if (calls > 0) printf "%-24s calls %9d usec %11d usec_per_call %7.2f\n", b[1], calls, usec, usec / calls
				} else printf "%-24s %.3f s\n", b[1], a[2] - b[2]
			}'
			echo "the load run: $(summary <"$work/profile.json")"
		} >"$out-cmdstat-$scenario.txt"
		{
			go tool pprof -top -nodecount=40 "$bin" "$out-cpu-$scenario.pprof"
			go tool pprof -top -cum -nodecount=60 "$bin" "$out-cpu-$scenario.pprof"
		} >"$out-cpu-$scenario.txt" 2>&1
	fi
done
loadavg "end" >>"$out-machine.txt"
rss "end" >>"$out-machine.txt"
{
	# Why calls time out (50 ms by default): slow inside Redis (slowlog,
	# over 10 ms; latency monitor, over 10 ms), or waiting for a CPU.
	echo "end: Redis slowlog (commands over 10 ms): $(rcli slowlog len) entries; latency monitor (events over 10 ms):"
	rcli latency latest | tr -d '\r' | paste -sd' ' | sed 's/^/  /'
	for s in $redis_servers; do
		echo "end: sluice serve ($s), Redis call durations (cumulative, all runs):"
		curl -fsS "http://${http_addr[$s]}/metrics" | grep -E '^sluice_redis_call_duration_seconds_(bucket|count)' | sed 's/^/  /'
	done
} >>"$out-machine.txt"

med() { printf '%s\n' "$@" | sort -g | sed -n 2p; } # the median of 3

# lua_ops prints the loop of LUA=1's operation timings: ARGV[1] repetitions
# of the operation named ARGV[2], on the values of a fixed-window hit of
# the 10k scenario (10^9 a day; the state "<idle-at> 6"). It follows
# take.lua's code for that path, with int.lua and algo.lua in scope.
lua_ops() {
	cat <<'EOF'
local X, N, op, key = int, tonumber(ARGV[1]), ARGV[2], KEYS[1]
local t = redis.call('TIME')
local now = X.add(X.mul(X.parse(t[1]), 1000000000), X.mul(X.parse(t[2]), 1000))
local idle = X.add(now, 86400000000000)
local v = X.str(idle) .. ' 6'
local p = {kind = 0, rate = 1000000000, period = 86400000000000, cap = 1000000000, interval = 0}
local st = {a = idle, b = 6}
local A = {'', 't', '1', '0', '1000000000', '86400000000000', '1000000000', '0', '1', '0', '0', '0'}
local r
if op == 'empty loop' then
  for i = 1, N do r = i end
elseif op == 'redis.call TIME' then
  for i = 1, N do r = redis.call('TIME') end
elseif op == 'now from the TIME reply' then
  for i = 1, N do r = X.add(X.mul(X.parse(t[1]), 1000000000), X.mul(X.parse(t[2]), 1000)) end
elseif op == 'parse one hit (8 args)' then
  for i = 1, N do
    local a = 4
    r = {{kind = tonumber(A[a]), p = {kind = 0, rate = X.parse(A[a + 1]), period = X.parse(A[a + 2]),
      cap = X.parse(A[a + 3]), interval = X.parse(A[a + 4])}, cost = X.parse(A[a + 5]),
      shadow = A[a + 6] == '1', blockfor = X.parse(A[a + 7]), prev = tonumber(A[a + 8]), key = key}}
  end
elseif op == 'int.parse of a 19-digit time' then
  local s = X.str(idle)
  for i = 1, N do r = X.parse(s) end
elseif op == 'int.str of a 19-digit time' then
  for i = 1, N do r = X.str(idle) end
elseif op == 'read_state: match, 2 parse, lt' then
  for i = 1, N do
    local a, b = string.match(v, '^(%d+) (%d+)$')
    a = X.parse(a)
    if X.lt(now, a) then r = {a = a, b = X.parse(b)} end
  end
elseif op == 'algo.step fixed_window' then
  for i = 1, N do r = algo.step(p, st, now, 1) end
elseif op == 'encode_state: 2 int.str' then
  for i = 1, N do r = X.str(st.a) .. ' ' .. X.str(st.b) end
elseif op == 'write_raw without SET: match, 2 parse, ttl' then
  for i = 1, N do
    local a = string.match(v, '^(%d+)')
    if a and X.lt(now, X.parse(a)) then
      local q = X.add(X.divceil(X.sub(X.parse(a), now), 1000000), 0)
      if X.lt(q, 1) then q = 1 end
      r = X.str(q)
    end
  end
elseif op == 'reply: 8 strings, 3 int.str' then
  for i = 1, N do
    r = {'1', X.str(999999994), X.str(60216196000000), X.str(0), '0', '1', v, v}
  end
elseif op == 'redis.call TIME, GET, SET' then
  for i = 1, N do
    r = redis.call('TIME')
    r = redis.call('GET', key)
    redis.call('SET', key, v, 'PX', 60216196)
  end
end
return 0
EOF
}

if [ "$lua" = 1 ]; then
	# What one decision costs inside Redis, in pieces. The store's own call
	# is captured with MONITOR (one request on one key within its limit:
	# a fixed-window hit, as in the 10k scenario) and replayed; the same
	# keys and arguments go to the Lua code run as a plain script.
	redis-cli -p "$redis_port" monitor >"$work/monitor.txt" &
	mon_pid=$!
	sleep 0.3
	"$bin" bench --mode "$mode" --target "$(target redis)" --connections 1 --concurrency 1 \
		--keys 1 --warmup 0 --duration 0 --requests 1 >/dev/null
	sleep 0.3
	kill "$mon_pid"
	wait "$mon_pid" 2>/dev/null || true
	if rcli client list | grep -q 'cmd=monitor'; then
		echo "redis.sh: a MONITOR client is still connected" >&2
		exit 1
	fi
	mapfile -t call < <(grep -m1 -E '"(FCALL|EVALSHA)"' "$work/monitor.txt" | sed 's/^[^]]*] //' | grep -o '"[^"]*"' | sed 's/^"//; s/"$//')
	if [ "${#call[@]}" -lt 3 ]; then
		echo "redis.sh: no FCALL or EVALSHA seen from the store" >&2
		exit 1
	fi
	lib="$(cat redisstore/internal/luasrc/int.lua)"$'\n'"$(cat redisstore/internal/luasrc/algo.lua)"$'\n'"$(cat redisstore/internal/luasrc/fast.lua)"$'\n'"$(cat redisstore/take.lua)"
	rest=("${call[@]:2}") # numkeys, keys, arguments
	{
		echo "One decision inside Redis, in pieces. The store's call, captured with MONITOR:"
		echo "  ${call[*]:0:2} ${rest[*]}"
		echo "replayed with redis-benchmark -n 40000 -c 32 -P 8 (pipelined, as the store's client does),"
		echo "3 times each. Per call: Redis CPU (INFO cpu, user+sys: the whole server, networking"
		echo "included) and time inside the command (commandstats usec_per_call of the script command,"
		echo "the GET/SET/TIME it calls included; wall time, so preemption by other processes inflates it);"
		echo "each time, then the median. Load average $(cut -d' ' -f1-3 /proc/loadavg)"
		printf '%-52s %32s %32s\n' piece "Redis CPU µs/call" "in-command µs/call"
		for piece in 'EVALSHA of "return 1"' 'EVALSHA of the definitions (Lib, take.lua)' \
			'EVALSHA of the definitions, then take(KEYS, ARGV)' "the store's own call (${call[0]})"; do
			case "$piece" in
			*'"return 1"') cmd=(evalsha "$(rcli script load 'return 1')" "${rest[@]}") ;;
			*'definitions (Lib'*) cmd=(evalsha "$(rcli script load "$lib"$'\nreturn 1')" "${rest[@]}") ;;
			*'take(KEYS'*) cmd=(evalsha "$(rcli script load "$lib"$'\nreturn take(KEYS, ARGV)')" "${rest[@]}") ;;
			*) cmd=("${call[@]}") ;;
			esac
			cpus=() usecs=()
			for _ in 1 2 3; do
				rcli config resetstat >/dev/null
				c0=$(rcli info cpu | tr -d '\r' | awk -F: '/^used_cpu_(user|sys):/ {s += $2} END {print s}')
				redis-benchmark -p "$redis_port" -n 40000 -c 32 -P 8 -q "${cmd[@]}" >/dev/null
				c1=$(rcli info cpu | tr -d '\r' | awk -F: '/^used_cpu_(user|sys):/ {s += $2} END {print s}')
				cpus+=("$(awk -v a="$c0" -v b="$c1" 'BEGIN {printf "%.2f", (b - a) * 1e6 / 40000}')")
				usecs+=("$(rcli info commandstats | tr -d '\r' | awk -F'[:,=]' -v c="cmdstat_${cmd[0],,}" '$1 == c {print $7}')")
			done
			printf '%-52s %6s %6s %6s med %6s   %6s %6s %6s med %6s\n' "$piece" \
				"${cpus[@]}" "$(med "${cpus[@]}")" "${usecs[@]}" "$(med "${usecs[@]}")"
		done
		echo "Commands the store's call ran inside, last replay:"
		rcli info commandstats | tr -d '\r' | grep -E '^cmdstat_(get|set|time|fcall|evalsha):' | sed 's/^/  /'
		echo
		echo "The Lua operations of that decision (a fixed-window hit on a key that exists), each"
		echo "repeated 20,000 times inside one EVAL of int.lua, algo.lua and the loop below (so the"
		echo "call and the definitions are amortized); Redis CPU per repetition, 3 times, median:"
		ops_sha=$(rcli script load "$lib"$'\n'"$(lua_ops)")
		for op in 'empty loop' 'redis.call TIME' 'now from the TIME reply' 'parse one hit (8 args)' \
			'int.parse of a 19-digit time' 'int.str of a 19-digit time' 'read_state: match, 2 parse, lt' \
			'algo.step fixed_window' 'encode_state: 2 int.str' 'write_raw without SET: match, 2 parse, ttl' \
			'reply: 8 strings, 3 int.str' 'redis.call TIME, GET, SET'; do
			cpus=()
			for _ in 1 2 3; do
				c0=$(rcli info cpu | tr -d '\r' | awk -F: '/^used_cpu_(user|sys):/ {s += $2} END {print s}')
				rcli evalsha "$ops_sha" 1 'sluice:{ops}k' 20000 "$op" >/dev/null
				c1=$(rcli info cpu | tr -d '\r' | awk -F: '/^used_cpu_(user|sys):/ {s += $2} END {print s}')
				cpus+=("$(awk -v a="$c0" -v b="$c1" 'BEGIN {printf "%.2f", (b - a) * 1e6 / 20000}')")
			done
			printf '  %-46s %6s %6s %6s med %6s µs\n' "$op" "${cpus[@]}" "$(med "${cpus[@]}")"
		done
	} | tee "$out-lua.txt"
fi

summarize "$out.jsonl" | tee "$out.md"
echo
cat "$out-machine.txt"
