#!/usr/bin/env bash
# envoyrl.sh compares sluice serve --store redis with envoyproxy/ratelimit
# ("envoy-rl" below), the service whose rules and gRPC API sluice takes
# over: the same redis-server, the same load generator (sluice bench, Envoy
# RLS v3 over gRPC), the same machine, in alternating rounds.
#
#   RATELIMIT_BIN=/work/peers/bin/ratelimit RATELIMIT_COMMIT=<commit> bench/envoyrl.sh
#                         # ROUNDS=5 DURATION=10s WARMUP=2s CONNECTIONS=2
#                         # CONCURRENCY=32 SCENARIOS="10k admitted" NODES=4
#                         # STREAMS=64 HOG=0 TP_NODES=1 REDIS_WRAP=
#                         # ALGORITHMS="fixed_window
#                         # token_bucket leaky_bucket gcra sliding_window
#                         # sliding_log sketch"
#   bench/envoyrl.sh summary bench/results/DATE-envoyrl.jsonl   # the tables again
#
# envoy-rl is not built here. Build envoyproxy/ratelimit from its source
# outside this repository (go build -o BIN ./src/service_cmd), give the
# binary as RATELIMIT_BIN (default /work/peers/bin/ratelimit; the script
# refuses to run without it) and the commit built as RATELIMIT_COMMIT,
# which goes into the results. Needs redis-server and redis-cli on the PATH,
# jq, curl, ss and /usr/bin/time.
#
# It starts its own redis-server (no persistence) and every server on free
# 127.0.0.1 ports, and stops every process it started on exit, failure
# included. sluice is built from this tree and run with its defaults
# (--store redis, its local cache of over-limit keys, the local failure
# policy) plus SLUICE_SERVE_FLAGS; envoy-rl with its defaults
# (no local cache, a 10 s Redis timeout, a pool of 10 connections, no
# write buffering (REDIS_PIPELINE_WINDOW 0: a request's INCRBY and EXPIRE
# go out as one pipeline at once), every hit counted even over the limit)
# plus RATELIMIT_ENV (e.g. "LOCAL_CACHE_SIZE_IN_BYTES=1048576" or
# "REDIS_PIPELINE_WINDOW=150us"), with its environment otherwise cleared. envoy-rl keeps its stats in a sink chosen by
# RATELIMIT_STATS: prometheus (default: kept in the process and served on a
# port of their own, unscraped, as sluice's /metrics are), none
# (DISABLE_STATS, a null sink) or log (USE_STATSD=false alone: its stdout
# sink, which writes a log line for every response time, a cost per
# request that a deployment would not pay).
#
# The rules: one file per algorithm, domain = the algorithm's name, each
# with the rules of both scenarios: {key: <any value>} 1,000,000,000 a day
# (one counter per value, far above what a run sends) and {key: hot} 500
# an hour (for token_bucket, leaky_bucket and gcra with burst 500). sluice
# loads them all, with `algorithm: X` in every rate_limit but
# fixed_window's; envoy-rl, which only has fixed windows, loads the
# fixed_window file, the same bytes sluice loads for its fixed_window row.
# Each run sends domain X.
#
# Scenarios, each run ROUNDS times; within a round envoy-rl runs first and
# then sluice with each algorithm in odd rounds, and the reverse in even
# ones (sluice's fixed_window is always next to envoy-rl), so that a burst
# of someone else's load on this shared machine spreads over both:
#
#   log500, log10k: as 10k, sluice's fixed_window and sliding_log only, on
#             100 keys filled with 500 hits each, or 10 keys with 10,000
#             (the fill is the warm-up): a sliding log of that many entries
#             and more, against a fixed window on the same keys.
#   10k       throughput: one node of each system (both running the whole
#             time, one idle while the other is measured), every request
#             one of 10,000 keys within its limit (sluice bench --keys
#             10000). Redis is flushed, then WARMUP of untimed load is sent
#             (a sluice bench of its own), then the counters are read, then
#             the measured sluice bench of DURATION (no warm-up of its own),
#             then the counters again: the CPU figures cover the measured
#             run only, the warm-up is not included. Per run: requests/s,
#             latency, Redis process CPU per 1,000 decisions (from
#             redis-server's /proc/PID/stat, utime + stime; a decision is a
#             request answered, each request being one descriptor; INFO
#             cpu as a cross-check), the server process's CPU per request
#             (/proc/PID/stat) and the load generator's (/usr/bin/time),
#             Redis's commands (INFO commandstats, script-inner commands
#             included) and their microseconds inside the command
#             (redis_cmd_us_per_decision: a script's own includes its
#             inner commands'), socket reads per decision. Redis's own idle
#             work (serverCron, some 2 ms a second) is not subtracted.
#             hot, hot10 and 1m (bench/serve.sh's, without pre-filling for
#             1m) are accepted too; "hot" is the key limited to 500 an hour.
#   admitted  "4 nodes, one hot key": NODES fresh processes of the system
#             under test (started for the run, stopped after it, so that
#             no local cache survives from a run before) on the one Redis,
#             flushed first; NODES sluice bench processes, one per node,
#             STREAMS gRPC streams in all (STREAMS/NODES each, one
#             connection), every request {key: hot}, for HOT_DURATION
#             (default DURATION), from the first request on (no warm-up).
#             Records the requests answered OK in all, against the limit,
#             500: a fixed window admits exactly 500, unless the run
#             crosses the top of the hour (recorded); token_bucket,
#             leaky_bucket and gcra refill 500 an hour, so may admit one
#             more every 7.2 s of the run (the bound recorded). HOG=1 runs
#             two busy loops (sh -c 'while :; do :; done') beside the
#             admitted runs, to keep both cores busy.
#
# OTHERS (default none) adds, to the throughput scenarios, runs of other
# servers on the fixed_window rules, each a node of its own running the
# whole time: "null" (sluice nullserver: answers OK at once, decides
# nothing: the cost of the RLS protocol and the load generator alone),
# "memory" (sluice serve --store memory), "lease" (sluice serve --store
# redis on the same Redis with every limit consistency: lease,
# max_overshoot: 1%, docs/leases.md). The tables then also give every
# system's requests a second over the null server's (OTHERS="null memory
# lease" makes the table of docs/benchmarks.md).
#
# TP_NODES (default 1) runs that many throughput nodes of each system on
# the one Redis, each with a load generator of its own (so that Redis is
# kept busier, as when many nodes share it; NODES is the admitted
# scenario's). REDIS_WRAP is a command that starts redis-server and must
# exec it (its pid is measured), e.g. "taskset -c 0".
#
# Writes bench/results/DATE-NAME.jsonl (one line per run; NAME defaults to
# envoyrl), DATE-NAME-machine.txt (machine, versions, envoy-rl's binary and
# commit, the settings, load average before each run, RSS) and DATE-NAME.md
# (the settings and the tables of summarize below).
set -euo pipefail
cd "$(dirname "$0")/.."

# summarize prints the tables of DATE-envoyrl.md from a jsonl file: medians
# across rounds per scenario and system (envoy-rl, sluice per algorithm),
# sluice over envoy-rl (the ratio of the medians, and the median of the
# ratios within a round), every round's figures, and the admitted counts.
summarize() { # file.jsonl
	jq -s -r '
	def median: map(select(. != null)) | sort | if length == 0 then null elif length % 2 == 1 then .[length / 2 | floor] else (.[length / 2 - 1] + .[length / 2]) / 2 end;
	def r(n): if . == null then "–" else . * n | round / n end;
	def med(f): map(f) | median;
	def algs: ["fixed_window", "token_bucket", "leaky_bucket", "gcra", "sliding_window", "sliding_log", "sketch"];
	def others: ["null", "memory", "lease"];
	def ord: if .system == "envoy-rl" then -1 elif .system == "sluice" then (.algorithm as $a | algs | index($a)) else (.system as $s | others | index($s) + 100) end;
	def name: if .system == "envoy-rl" then "envoy-rl" elif .system == "sluice" then "sluice \(.algorithm)" else {null: "sluice nullserver", memory: "sluice serve, memory store", lease: "sluice serve, leases"}[.system] end;
	def redis: .system == "sluice" or .system == "lease";
	def ratio($a; $b): if $a == null or $b == null or $b == 0 then null else $a / $b end;
	def cmds: (map(.redis_cmds | keys) | add // [] | unique) as $k |
		[$k[] as $c | {c: $c, n: med((.redis_cmds[$c] // 0) / .decisions)} | select(.n >= 0.005)] |
		sort_by(-.n) | map("\(.c) \(.n | r(100))") | join(", ");
	def row: {label: (.[0] | name), system: .[0].system, algorithm: .[0].algorithm, rounds: length,
		rps: med(.rps), p50: med(.p50_us), p99: med(.p99_us),
		rcpu: med(.redis_cpu_ms_per_1k), rinfo: med(.redis_info_cpu_ms_per_1k),
		scpu: med(.server_cpu_us_per_req), gen: med(.gen_cpu_us_per_req),
		reads: med(.redis_reads_per_decision), cmds: cmds,
		errors: (map(.errors) | add), store_errors: (map(.store_errors // 0) | add)};
	map(select(.scenario != "admitted")) as $tp |
	map(select(.scenario == "admitted")) as $ad |
	($tp | group_by(.scenario) | map(
		. as $runs |
		{scenario: .[0].scenario,
		 rows: (sort_by(ord) | group_by(ord) | map(row)),
		 rounds: (group_by(.round) | map(
			(map(select(.system == "envoy-rl"))[0]) as $e |
			(map(select(.system == "null"))[0]) as $z |
			map(. + {rps_ratio: ratio(.rps; $e.rps), rcpu_ratio: ratio(.redis_cpu_ms_per_1k; $e.redis_cpu_ms_per_1k),
				null_ratio: ratio(.rps; $z.rps)})) | flatten)}
		| .rounds as $rr
		| .rows |= map(. as $row | . + {
			rps_ratio_rounds: ($rr | map(select(.system == $row.system and .algorithm == $row.algorithm)) | med(.rps_ratio)),
			rcpu_ratio_rounds: ($rr | map(select(.system == $row.system and .algorithm == $row.algorithm)) | med(.rcpu_ratio)),
			null_ratio_rounds: ($rr | map(select(.system == $row.system and .algorithm == $row.algorithm)) | med(.null_ratio))})
		| (.rows | map(select(.system == "envoy-rl"))[0]) as $e
		| (.rows | map(select(.system == "null"))[0]) as $z
		| .rows |= map(. + {rps_ratio: ratio(.rps; $e.rps), rcpu_ratio: ratio(.rcpu; $e.rcpu), scpu_ratio: ratio(.scpu; $e.scpu),
			null_ratio: ratio(.rps; $z.rps)}))) as $t |
	(if ($t | length) > 0 then
	 ["## Throughput: medians across rounds", "",
	  "| scenario | system | rounds | req/s | p50 µs | p99 µs | Redis CPU ms per 1k decisions (/proc) | same from INFO cpu | server CPU µs/req | generator CPU µs/req | Redis commands per decision | Redis socket reads per decision | errors | store errors |",
	  "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|"] +
	 ($t | map(.scenario as $s | .rows[] |
		"| \($s) | \(.label) | \(.rounds) | \(.rps | round) | \(.p50 | r(1)) | \(.p99 | r(1)) | \(.rcpu | r(100)) | \(.rinfo | r(100)) | \(.scpu | r(10)) | \(.gen | r(10)) | \(.cmds) | \(.reads | r(1000)) | \(.errors) | \(if redis then .store_errors else "–" end) |")) +
	 ["", "## sluice over envoy-rl", "",
	  "Ratio of the medians above, and in brackets the median of the ratios within each round (the envoy-rl run of the same round).", "",
	  "| scenario | sluice algorithm | req/s | Redis CPU per 1k decisions | server CPU per request |",
	  "|---|---|---:|---:|---:|"] +
	 ($t | map(.scenario as $s | .rows[] | select(.system != "envoy-rl") |
		"| \($s) | \(if .system == "sluice" then .algorithm else .label end) | \(.rps_ratio | r(100)) (\(.rps_ratio_rounds | r(100))) | \(if redis then "\(.rcpu_ratio | r(100)) (\(.rcpu_ratio_rounds | r(100)))" else "–" end) | \(.scpu_ratio | r(100)) |")) +
	 (if ($tp | map(select(.system == "null")) | length) > 0 then
	  ["", "## Over the null server", "",
	   "Requests a second of each system over sluice nullserver'"'"'s (which answers OK at once and decides nothing): the ratio of the medians, and in brackets the median of the ratios within each round.", "",
	   "| scenario | system | req/s over null |",
	   "|---|---|---:|"] +
	  ($t | map(.scenario as $s | .rows[] | select(.system != "null") |
		"| \($s) | \(.label) | \(.null_ratio | r(100)) (\(.null_ratio_rounds | r(100))) |"))
	  else [] end) +
	 ["", "## The long sliding logs", "",
	  "Scenarios log500 and log10k: every key filled with 500 (100 keys) or 10,000 (10 keys) hits first, one entry each; the run adds more. Redis CPU per decision of sluice_log over sluice fixed_window on the same keys (ratio of the medians, and the median of the ratios within each round).", "",
	  "| scenario | sliding_log Redis CPU ms per 1k | fixed_window | ratio |",
	  "|---|---:|---:|---:|"] +
	 ($t | map(select(.scenario | startswith("log")) |
		(.rows | map(select(.algorithm == "sliding_log"))[0]) as $l |
		(.rows | map(select(.algorithm == "fixed_window"))[0]) as $f |
		(.rounds | group_by(.round) | map(
			(map(select(.algorithm == "fixed_window"))[0].redis_cpu_ms_per_1k) as $fr |
			map(select(.algorithm == "sliding_log"))[0].redis_cpu_ms_per_1k / $fr) | median) as $rr |
		"| \(.scenario) | \($l.rcpu | r(100)) | \($f.rcpu | r(100)) | \(ratio($l.rcpu; $f.rcpu) | r(100)) (\($rr | r(100))) |")) +
	 ["", "## Throughput: every run", "",
	  "| scenario | round | system | load average (1 min) | req/s | p99 µs | Redis CPU ms per 1k decisions | server CPU µs/req | sluice/envoy-rl req/s | sluice/envoy-rl Redis CPU |",
	  "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"] +
	 ($t | map(.rounds | sort_by(.round, ord)[] |
		"| \(.scenario) | \(.round) | \(name) | \(.load1) | \(.rps | round) | \(.p99_us | r(1)) | \(.redis_cpu_ms_per_1k | r(100)) | \(.server_cpu_us_per_req | r(10)) | \(if .system != "envoy-rl" then (.rps_ratio | r(100)) else "" end) | \(if redis then (.rcpu_ratio | r(100)) else "" end) |"))
	 else [] end) +
	(if ($ad | length) > 0 then
	 ["", "## Admitted: \($ad[0].nodes) nodes, one hot key, \($ad[0].limit) an hour, \($ad[0].streams) streams, \($ad[0].duration) per run", "",
	  "Admitted = the requests answered OK by all nodes together. Bound: the limit, plus for the bucket algorithms what they refill during the run (500 an hour). A round marked * crossed the top of the hour (a fixed window then starts afresh: not judged).", "",
	  "| system | rounds | admitted, every round | bound | rounds over the bound | over limit | errors | store errors | req/s (all nodes) | Redis CPU ms per 1k decisions | CPU hog |",
	  "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---|"] +
	 ($ad | sort_by(ord) | group_by(ord) | map(
		"| \(.[0] | name) | \(length) | \(sort_by(.round) | map("\(.ok)\(if .crossed_hour then "*" else "" end)") | join(", ")) | \(map(.bound) | unique | map(tostring) | join(", ")) | \(map(select(.ok > .bound and (.crossed_hour | not))) | length) | \(map(.over_limit) | add) | \(map(.errors) | add) | \(if .[0].system == "sluice" then (map(.store_errors // 0) | add) else "–" end) | \(med(.rps) | round) | \(med(.redis_cpu_ms_per_1k) | r(100)) | \(if .[0].hog then "yes" else "no" end) |"))
	 else [] end) |
	.[]' "$1"
}

# bench/envoyrl.sh summary FILE.jsonl: only print the tables of a past run.
if [ "${1:-}" = summary ]; then
	summarize "$2"
	exit
fi

all_algorithms="fixed_window token_bucket leaky_bucket gcra sliding_window sliding_log sketch"
rounds=${ROUNDS:-5}
duration=${DURATION:-10s}
warmup=${WARMUP:-2s}
connections=${CONNECTIONS:-2}
concurrency=${CONCURRENCY:-32}
scenarios=${SCENARIOS:-10k admitted}
algorithms=${ALGORITHMS:-$all_algorithms}
nodes=${NODES:-4}
streams=${STREAMS:-64}
hot_duration=${HOT_DURATION:-$duration}
hog=${HOG:-0}
name=${NAME:-envoyrl}
ratelimit_bin=${RATELIMIT_BIN:-/work/peers/bin/ratelimit}
ratelimit_commit=${RATELIMIT_COMMIT:-}
ratelimit_env=${RATELIMIT_ENV:-}
ratelimit_stats=${RATELIMIT_STATS:-prometheus}
sluice_serve_flags=${SLUICE_SERVE_FLAGS:-}
tp_nodes=${TP_NODES:-1}
others=${OTHERS:-}
redis_wrap=${REDIS_WRAP:-}
hot_limit=500

if [ ! -x "$ratelimit_bin" ]; then
	cat >&2 <<EOF
envoyrl.sh: no envoyproxy/ratelimit binary at $ratelimit_bin.
Build it from its source outside this repository
(go build -o BIN ./src/service_cmd in a checkout of envoyproxy/ratelimit)
and run with RATELIMIT_BIN=BIN RATELIMIT_COMMIT=<the commit built>.
EOF
	exit 1
fi
for c in redis-server redis-cli jq curl ss /usr/bin/time; do
	command -v "$c" >/dev/null || {
		echo "envoyrl.sh: $c not found" >&2
		exit 1
	}
done
case "$ratelimit_stats" in
prometheus | none | log) ;;
*)
	echo "envoyrl.sh: RATELIMIT_STATS is prometheus, none or log, not $ratelimit_stats" >&2
	exit 2
	;;
esac
for a in $algorithms; do
	case " $all_algorithms " in
	*" $a "*) ;;
	*)
		echo "envoyrl.sh: unknown algorithm $a (known: $all_algorithms)" >&2
		exit 2
		;;
	esac
done
for o in $others; do
	case "$o" in
	null | memory | lease) ;;
	*)
		echo "envoyrl.sh: OTHERS are null, memory or lease, not $o" >&2
		exit 2
		;;
	esac
done
if [ $((streams % nodes)) != 0 ]; then
	echo "envoyrl.sh: STREAMS ($streams) is not a multiple of NODES ($nodes)" >&2
	exit 2
fi

# shellcheck source=bench/lib.sh
. bench/lib.sh
for s in $scenarios; do
	if [ "$s" != admitted ]; then
		rls_flags "$s" >/dev/null # exits on an unknown scenario
	fi
done
bench_setup "$name"
trap 'exit 130' INT TERM
hz=$(getconf CLK_TCK)

# forget PID...: takes processes that have been stopped (and waited for)
# off the list that cleanup stops on exit.
forget() {
	local p keep=()
	for p in "${pids[@]}"; do
		case " $* " in *" $p "*) ;; *) keep+=("$p") ;; esac
	done
	pids=("${keep[@]}")
}

# The rules: sluice's directory, one file per algorithm, and envoy-rl's
# runtime directory with the fixed_window file alone.
mkdir -p "$work/sluice-rules" "$work/rl/ratelimit/config"
for a in $all_algorithms; do
	algo="" burst=""
	if [ "$a" != fixed_window ]; then
		algo=", algorithm: $a"
	fi
	case "$a" in token_bucket | leaky_bucket | gcra) burst=", burst: $hot_limit" ;; esac
	cat >"$work/sluice-rules/$a.yaml" <<EOF
domain: $a
descriptors:
  - key: key
    value: hot
    rate_limit: {unit: hour, requests_per_unit: $hot_limit$algo$burst}
  - key: key
    rate_limit: {unit: day, requests_per_unit: 1000000000$algo}
EOF
done
cp "$work/sluice-rules/fixed_window.yaml" "$work/rl/ratelimit/config/"
"$bin" check --config "$work/sluice-rules" >/dev/null
# OTHERS=lease: the fixed_window rules, every limit leased.
case " $others " in
*" lease "*)
	mkdir -p "$work/lease-rules"
	sed 's/^domain: .*/&\nconsistency: lease\nmax_overshoot: 1%/' "$work/sluice-rules/fixed_window.yaml" >"$work/lease-rules/fixed_window.yaml"
	"$bin" check --config "$work/lease-rules" >/dev/null
	;;
esac

redis_port=
pick_port redis_port
# shellcheck disable=SC2086 # REDIS_WRAP is a command and its arguments
$redis_wrap redis-server --bind 127.0.0.1 --port "$redis_port" --save "" --appendonly no \
	--dir "$work" --logfile "$work/redis.log" &
redis_pid=$!
pids+=("$redis_pid")
rcli() { redis-cli -p "$redis_port" "$@"; }
for _ in $(seq 100); do
	rcli ping >/dev/null 2>&1 && break
	sleep 0.1
done
rcli ping >/dev/null 2>&1 || {
	echo "envoyrl.sh: redis-server on port $redis_port not answering" >&2
	cat "$work/redis.log" >&2
	exit 1
}

# start_server SYSTEM LABEL starts one node of envoy-rl or sluice on free
# loopback ports, logging to $work/LABEL.log, and sets server_pid,
# server_grpc, server_http and server_ready (the URL that answers when it
# is ready); the caller waits with ready.
start_server() { # system label
	local http grpc debug prom env
	pick_port http
	pick_port grpc
	pick_port debug
	server_grpc=127.0.0.1:$grpc
	server_http=127.0.0.1:$http
	case "$1" in
	envoy-rl)
		env=(env -i "PATH=$PATH" "REDIS_URL=127.0.0.1:$redis_port" REDIS_SOCKET_TYPE=tcp
			USE_STATSD=false LOG_LEVEL=warn "RUNTIME_ROOT=$work/rl" RUNTIME_SUBDIRECTORY=ratelimit
			RUNTIME_WATCH_ROOT=false HOST=127.0.0.1 "PORT=$http" GRPC_HOST=127.0.0.1 "GRPC_PORT=$grpc"
			DEBUG_HOST=127.0.0.1 "DEBUG_PORT=$debug")
		case "$ratelimit_stats" in
		prometheus)
			pick_port prom
			env+=(USE_PROMETHEUS=true "PROMETHEUS_ADDR=127.0.0.1:$prom")
			;;
		none) env+=(DISABLE_STATS=true) ;;
		esac
		# shellcheck disable=SC2206 # RATELIMIT_ENV is a list of VAR=value words
		env+=($ratelimit_env)
		"${env[@]}" "$ratelimit_bin" >"$work/$2.log" 2>&1 &
		server_ready=http://$server_http/healthcheck
		;;
	sluice | lease)
		local rules=$work/sluice-rules
		if [ "$1" = lease ]; then rules=$work/lease-rules; fi
		# shellcheck disable=SC2086 # SLUICE_SERVE_FLAGS is a list of flags
		"$bin" serve --config "$rules" --store redis --redis-url "redis://127.0.0.1:$redis_port" \
			--grpc-addr "$server_grpc" --http-addr "$server_http" --debug-addr "127.0.0.1:$debug" \
			--log-format json $sluice_serve_flags 2>"$work/$2.log" &
		server_ready=http://$server_http/readyz
		;;
	memory)
		"$bin" serve --config "$work/sluice-rules" --store memory \
			--grpc-addr "$server_grpc" --http-addr "$server_http" --debug-addr "127.0.0.1:$debug" \
			--log-format json 2>"$work/$2.log" &
		server_ready=http://$server_http/readyz
		;;
	null)
		"$bin" nullserver --grpc-addr "$server_grpc" --http-addr "" 2>"$work/$2.log" &
		server_ready=tcp:$grpc
		;;
	esac
	server_pid=$!
	pids+=("$server_pid")
}

alive() { # pid label: fails loudly when the server has gone
	kill -0 "$1" 2>/dev/null || {
		echo "envoyrl.sh: $2 (pid $1) has exited" >&2
		cat "$work/$2.log" >&2
		exit 1
	}
}

# up URL LOG...: ready, or for tcp:PORT a listener on that port.
up() {
	local url=$1 _
	case "$url" in
	tcp:*)
		for _ in $(seq 100); do
			(: </dev/tcp/127.0.0.1/"${url#tcp:}") 2>/dev/null && return 0
			sleep 0.1
		done
		echo "port ${url#tcp:} not listening" >&2
		shift
		cat "$@" >&2
		return 1
		;;
	*) ready "$@" ;;
	esac
}

# The throughput nodes, TP_NODES of each system (one by default), running
# the whole time; tp_pid, tp_grpc and tp_http hold each system's list.
declare -A tp_pid tp_grpc tp_http
for s in envoy-rl sluice $others; do
	for i in $(seq "$tp_nodes"); do
		label=tp-$s
		if [ "$i" != 1 ]; then label=tp-$s-$i; fi
		start_server "$s" "$label"
		tp_pid[$s]=${tp_pid[$s]:+${tp_pid[$s]} }$server_pid
		tp_grpc[$s]=${tp_grpc[$s]:+${tp_grpc[$s]} }$server_grpc
		tp_http[$s]=${tp_http[$s]:+${tp_http[$s]} }$server_http
		up "$server_ready" "$work/$label.log" "$work/redis.log"
	done
done

rss() { # label
	local s p
	for s in envoy-rl sluice $others; do
		for p in ${tp_pid[$s]}; do
			echo "$1: $s (throughput node) VmRSS $(awk '/VmRSS/ {print $2, $3}' "/proc/$p/status")"
		done
	done
	echo "$1: redis-server VmRSS $(awk '/VmRSS/ {print $2, $3}' "/proc/$redis_pid/status"), used_memory $(rcli info memory | awk -F: '/^used_memory:/ {print $2}' | tr -d '\r') B, keys $(rcli dbsize)"
}
settings() {
	echo "load: sluice bench over gRPC; throughput: $([ "$tp_nodes" != 1 ] && echo "$tp_nodes nodes of each system, a load generator each with ")$connections connection(s), $concurrency in flight, warm-up $warmup (untimed, a run of its own, not in the CPU figures), duration $duration; admitted: $nodes nodes, $streams streams ($((streams / nodes)) per node, 1 connection each), $hot_duration, limit $hot_limit an hour, CPU hog: $([ "$hog" = 1 ] && echo "yes, 2 busy loops" || echo no); $rounds rounds"
	echo "scenarios: $scenarios; sluice algorithms: $algorithms"
	echo "envoy-rl: $ratelimit_bin, commit ${ratelimit_commit:-unknown (RATELIMIT_COMMIT not set)}, $(go version "$ratelimit_bin" 2>/dev/null | cut -d' ' -f2- || echo "?")"
	echo "envoy-rl environment: REDIS_URL=127.0.0.1:PORT REDIS_SOCKET_TYPE=tcp USE_STATSD=false LOG_LEVEL=warn RUNTIME_WATCH_ROOT=false, stats sink: $ratelimit_stats${ratelimit_env:+, RATELIMIT_ENV: $ratelimit_env} (defaults otherwise: no local cache, REDIS_TIMEOUT 10s, REDIS_POOL_SIZE 10, REDIS_PIPELINE_WINDOW 0 (no write buffering; a request's INCRBY and EXPIRE go as one pipeline), STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=false)"
	echo "sluice serve: --store redis --redis-url redis://127.0.0.1:PORT${sluice_serve_flags:+ $sluice_serve_flags} (defaults otherwise)"
	if [ -n "$others" ]; then
		echo "others, on the fixed_window rules: $others (null: sluice nullserver; memory: sluice serve --store memory; lease: as sluice serve above, every limit consistency: lease, max_overshoot: 1%)"
	fi
	echo "$(redis-server --version | cut -d' ' -f1-3), no persistence, pid $redis_pid${redis_wrap:+, started under: $redis_wrap}"
}
{
	machine_facts
	settings
	echo "throughput nodes: envoy-rl pid ${tp_pid[envoy-rl]} grpc ${tp_grpc[envoy-rl]}, sluice pid ${tp_pid[sluice]} grpc ${tp_grpc[sluice]}"
	loadavg "start"
	rss "start"
} >"$out-machine.txt"

# counters prints, as one JSON object, Redis's counters (the process's CPU
# ticks, INFO cpu, commandstats, socket reads) and, summed over the sluice
# nodes whose HTTP addresses are given, the Redis store's calls by result.
counters() { # [sluice HTTP address...]
	local info a
	info=$(rcli info everything | tr -d '\r')
	{
		awk -F'[:,=]' '/^used_cpu_(user|sys):/ {print $1, $2}
			/^cmdstat_/ {sub(/^cmdstat_/, "", $1); print "cmd_" $1, $3; print "usec_" $1, $5}
			/^total_reads_processed:/ {print "reads", $2}' <<<"$info"
		echo "redis_ticks $(cpu_ticks "$redis_pid")"
		for a in "$@"; do
			curl -fsS "http://$a/metrics" |
				awk '/^sluice_redis_calls_total\{result="[a-z]+"\}/ {
					sub(/.*result="/, "", $1); sub(/"\}/, "", $1); print "calls_" $1, $2 }'
		done
	} | awk '{s[$1] += $2} END {for (k in s) printf "%s %.6f\n", k, s[k]}' |
		jq -R -n '[inputs | split(" ") | {(.[0]): (.[1] | tonumber)}] | add'
}

# The jq that turns counters before ($b) and after ($a) a run into the
# Redis figures of the run, per decision ($n).
# shellcheck disable=SC2016 # jq's variables, not the shell's
redis_figures='(($a | with_entries(.value -= ($b[.key] // 0))) as $d |
	{redis_proc_cpu_ms: ($d.redis_ticks / $hz * 1e3),
	 redis_cpu_ms_per_1k: ($d.redis_ticks / $hz * 1e3 / $n * 1e3),
	 redis_info_cpu_ms_per_1k: (($d.used_cpu_user + $d.used_cpu_sys) * 1e3 / $n * 1e3),
	 redis_reads_per_decision: ($d.reads / $n),
	 redis_cmds: ($d | with_entries(select((.key | startswith("cmd_")) and .key != "cmd_info" and .value > 0)
		| .key |= ltrimstr("cmd_"))),
	 redis_cmd_us_per_decision: ($d | with_entries(select((.key | startswith("usec_")) and .key != "usec_info" and .value > 0)
		| .key |= ltrimstr("usec_") | .value /= $n)),
	 store_calls: ($d | with_entries(select(.key | startswith("calls_"))) | if length > 0 then . else null end),
	 store_errors: ($d | with_entries(select((.key | startswith("calls_")) and .key != "calls_ok")) | if length > 0 then (map(.) | add) else null end)})'

# throughput SYSTEM ALGORITHM SCENARIO ROUND: one run on the throughput
# node(s), printed as a jsonl line. With TP_NODES above 1, every node of
# the system has a load generator of its own (CONNECTIONS x CONCURRENCY
# each), all run at once: the line sums their requests, rates and counts,
# and has the median of their p50s and the worst of their p99s (and
# tp_nodes, rps_per_node); CPU figures are of all the nodes together.
throughput() {
	local sys=$1 alg=$2 scenario=$3 round=$4 b a ticks=0 load1 i p label
	local metrics=() npid=() ngrpc=() gpid=()
	read -r -a npid <<<"${tp_pid[$sys]}"
	read -r -a ngrpc <<<"${tp_grpc[$sys]}"
	if [ "$sys" = sluice ] || [ "$sys" = lease ]; then
		read -r -a metrics <<<"${tp_http[$sys]}"
	fi
	rcli flushall sync >/dev/null
	case "$scenario" in
	log500 | log10k)
		# Fill every key with that many hits first, each at a time of
		# its own: a sliding log of that many entries (a fixed window,
		# one count). This is the warm-up, through the first node.
		local per=500 keys=100
		if [ "$scenario" = log10k ]; then per=10000 keys=10; fi
		# shellcheck disable=SC2046
		"$bin" bench --target "${ngrpc[0]}" --domain "$alg" --connections "$connections" \
			--concurrency "$concurrency" $(rls_flags "$scenario") --warmup 0 --duration 0 \
			--requests $((per * keys)) >"$work/warmup.txt"
		;;
	*)
		if [[ ! "$warmup" =~ ^0+[a-z]*$ ]]; then
			for i in "${!ngrpc[@]}"; do
				# shellcheck disable=SC2046
				"$bin" bench --target "${ngrpc[i]}" --domain "$alg" --connections "$connections" \
					--concurrency "$concurrency" $(rls_flags "$scenario") --warmup 0 --duration "$warmup" \
					>"$work/warmup-$i.txt" &
				gpid+=("$!")
				pids+=("$!")
			done
			for p in "${gpid[@]}"; do wait "$p"; done
			forget "${gpid[@]}"
			gpid=()
		fi
		;;
	esac
	load1=$(cut -d' ' -f1 /proc/loadavg)
	b=$(counters "${metrics[@]}")
	for p in "${npid[@]}"; do ticks=$((ticks - $(cpu_ticks "$p"))); done
	for i in "${!ngrpc[@]}"; do
		# shellcheck disable=SC2046
		/usr/bin/time -f '%U %S' -o "$work/gen-$i.time" \
			"$bin" bench --json --target "${ngrpc[i]}" --domain "$alg" --connections "$connections" \
			--concurrency "$concurrency" $(rls_flags "$scenario") --warmup 0 --duration "$duration" \
			>"$work/run-$i.json" 2>"$work/run-$i.err" &
		gpid+=("$!")
		pids+=("$!")
	done
	for i in "${!gpid[@]}"; do
		wait "${gpid[i]}" || {
			echo "envoyrl.sh: sluice bench against $sys node $((i + 1)) failed" >&2
			cat "$work/run-$i.err" >&2
			exit 1
		}
	done
	forget "${gpid[@]}"
	for p in "${npid[@]}"; do ticks=$((ticks + $(cpu_ticks "$p"))); done
	a=$(counters "${metrics[@]}")
	for i in "${!npid[@]}"; do
		label=tp-$sys
		if [ "$i" != 0 ]; then label=tp-$sys-$((i + 1)); fi
		alive "${npid[i]}" "$label"
	done
	for i in "${!ngrpc[@]}"; do cat "$work/run-$i.json"; done |
		jq -s -c 'def median: sort | if length % 2 == 1 then .[length / 2 | floor] else (.[length / 2 - 1] + .[length / 2]) / 2 end;
		def sum(f): map(f) | add;
		if length == 1 then .[0] else
			.[0] + {target: (map(.target) | join(" ")), seconds: (map(.seconds) | max),
			 requests: sum(.requests), warmup_requests: sum(.warmup_requests), rps: sum(.rps),
			 ok: sum(.ok), over_limit: sum(.over_limit), unknown: sum(.unknown), errors: sum(.errors),
			 min_us: (map(.min_us) | min), mean_us: (sum(.mean_us * .requests) / sum(.requests)),
			 p50_us: (map(.p50_us) | median), p90_us: (map(.p90_us) | max), p99_us: (map(.p99_us) | max),
			 p999_us: (map(.p999_us) | max), max_us: (map(.max_us) | max),
			 tp_nodes: length, rps_per_node: map(.rps)} end' |
		jq -c --arg scenario "$scenario" --arg sys "$sys" --arg alg "$alg" --argjson round "$round" \
			--argjson load1 "$load1" --argjson ticks "$ticks" --argjson hz "$hz" \
			--argjson gen "$(cat "$work"/gen-*.time | awk '{s += $1 + $2} END {print s}')" \
			--argjson b "$b" --argjson a "$a" \
			'(.requests + .warmup_requests) as $n |
		 {scenario: $scenario, system: $sys, algorithm: $alg, round: $round, load1: $load1} + . +
		 {decisions: $n, warmup_in_cpu: false,
		  server_cpu_us_per_req: ($ticks / $hz * 1e6 / $n),
		  gen_cpu_us_per_req: ($gen * 1e6 / $n)} + '"$redis_figures"
	rm -f "$work"/gen-*.time
}

# admitted SYSTEM ALGORITHM ROUND: one run of NODES fresh nodes on the hot
# key, printed as a jsonl line.
admitted() {
	local sys=$1 alg=$2 round=$3 i b a t0 t1 load1 ticks=0 npid=() ngrpc=() nready=() metrics=() bpid=()
	for i in $(seq "$nodes"); do
		start_server "$sys" "adm-$sys-$i"
		npid+=("$server_pid")
		ngrpc+=("$server_grpc")
		nready+=("$server_ready")
		if [ "$sys" = sluice ]; then
			metrics+=("$server_http")
		fi
	done
	for i in $(seq "$nodes"); do
		ready "${nready[i - 1]}" "$work/adm-$sys-$i.log" "$work/redis.log"
	done
	rcli flushall sync >/dev/null
	load1=$(cut -d' ' -f1 /proc/loadavg)
	b=$(counters "${metrics[@]}")
	for i in "${npid[@]}"; do
		ticks=$((ticks - $(cpu_ticks "$i")))
	done
	t0=$(date +%s.%N)
	for i in $(seq "$nodes"); do
		"$bin" bench --json --target "${ngrpc[i - 1]}" --domain "$alg" --connections 1 \
			--concurrency $((streams / nodes)) --keys 1 --hot 1 --warmup 0 --duration "$hot_duration" \
			>"$work/adm-$i.json" 2>"$work/adm-$i.err" &
		bpid+=("$!")
		pids+=("$!")
	done
	for i in $(seq "$nodes"); do
		wait "${bpid[i - 1]}" || {
			echo "envoyrl.sh: sluice bench against $sys node $i failed" >&2
			cat "$work/adm-$i.err" "$work/adm-$sys-$i.log" >&2
			exit 1
		}
	done
	forget "${bpid[@]}"
	t1=$(date +%s.%N)
	for i in "${npid[@]}"; do
		ticks=$((ticks + $(cpu_ticks "$i")))
	done
	a=$(counters "${metrics[@]}")
	for i in $(seq "$nodes"); do
		alive "${npid[i - 1]}" "adm-$sys-$i"
	done
	kill "${npid[@]}"
	wait "${npid[@]}" 2>/dev/null || true
	forget "${npid[@]}"
	for i in $(seq "$nodes"); do cat "$work/adm-$i.json"; done |
		jq -s -c --arg sys "$sys" --arg alg "$alg" --argjson round "$round" --argjson load1 "$load1" \
			--argjson nodes "$nodes" --argjson streams "$streams" --argjson limit "$hot_limit" \
			--arg duration "$hot_duration" --argjson hog "$([ "$hog" = 1 ] && echo true || echo false)" \
			--argjson t0 "$t0" --argjson t1 "$t1" --argjson ticks "$ticks" --argjson hz "$hz" \
			--argjson b "$b" --argjson a "$a" '
		(map(.requests + .warmup_requests) | add) as $n |
		{scenario: "admitted", system: $sys, algorithm: $alg, round: $round, load1: $load1,
		 nodes: $nodes, streams: $streams, limit: $limit, hog: $hog,
		 duration: $duration,
		 ok: (map(.ok) | add), over_limit: (map(.over_limit) | add), unknown: (map(.unknown) | add),
		 errors: (map(.errors) | add), requests: $n, rps: (map(.rps) | add),
		 ok_per_node: map(.ok), wall_seconds: ($t1 - $t0),
		 crossed_hour: (($t0 / 3600 | floor) != ($t1 / 3600 | floor)),
		 bound: ($limit + (if $alg == "token_bucket" or $alg == "leaky_bucket" or $alg == "gcra" then ($t1 - $t0) * $limit / 3600 | floor else 0 end)),
		 decisions: $n, server_cpu_us_per_req: ($ticks / $hz * 1e6 / $n)} + '"$redis_figures"
}

line() { # the one-line summary of a jsonl line
	jq -r '"\(.scenario) round \(.round) \(if .system == "envoy-rl" then "envoy-rl" elif .system == "sluice" then "sluice \(.algorithm)" else .system end) (load \(.load1)): " +
		if .scenario == "admitted" then
			"admitted \(.ok) of limit \(.limit) (bound \(.bound)\(if .crossed_hour then ", crossed the hour" else "" end); per node \(.ok_per_node | join("+"))) over \(.over_limit) errors \(.errors)\(if .store_errors != null then " store errors \(.store_errors)" else "" end), \(.rps | floor) req/s, Redis \(.redis_cpu_ms_per_1k * 100 | round / 100) ms/1k"
		else
			"\(.rps | floor) req/s p50 \(.p50_us | round)µs p99 \(.p99_us | round)µs ok \(.ok) over \(.over_limit) errors \(.errors)\(if .store_errors != null then " store errors \(.store_errors)" else "" end); Redis \(.redis_cpu_ms_per_1k * 100 | round / 100) ms/1k decisions (INFO \(.redis_info_cpu_ms_per_1k * 100 | round / 100)), server \(.server_cpu_us_per_req * 10 | round / 10) µs/req, Redis commands/decision \(.decisions as $n | .redis_cmds | to_entries | map(select(.value / $n >= 0.005) | "\(.key) \(.value / $n * 100 | round / 100)") | join(" "))"
		end'
}

# order ROUND prints the runs of a round, system:algorithm, envoy-rl first
# in odd rounds and last in even ones (sluice's algorithms reversed, so
# that fixed_window is next to envoy-rl), OTHERS after sluice's.
order() { # round scenario
	local list=(envoy-rl:fixed_window) a i
	for a in $algorithms; do list+=("sluice:$a"); done
	case "$2" in
	log500 | log10k) list=(sluice:fixed_window sluice:sliding_log) ;;
	admitted) ;;
	*) for a in $others; do list+=("$a:fixed_window"); done ;;
	esac
	if [ $(($1 % 2)) = 1 ]; then
		printf '%s\n' "${list[@]}"
	else
		for ((i = ${#list[@]} - 1; i >= 0; i--)); do echo "${list[i]}"; done
	fi
}

hog_pids=()
: >"$out.jsonl"
for scenario in $scenarios; do
	if [ "$scenario" = admitted ] && [ "$hog" = 1 ]; then
		for _ in 1 2; do
			sh -c 'while :; do :; done' &
			hog_pids+=("$!")
			pids+=("$!")
		done
	fi
	for round in $(seq "$rounds"); do
		for run in $(order "$round" "$scenario"); do
			sys=${run%%:*} alg=${run#*:}
			loadavg "$scenario round $round $sys $alg" >>"$out-machine.txt"
			# Not in a pipeline: the runs start processes that cleanup
			# must know of, in this shell.
			if [ "$scenario" = admitted ]; then
				admitted "$sys" "$alg" "$round"
			else
				throughput "$sys" "$alg" "$scenario" "$round"
			fi >"$work/line.json"
			cat "$work/line.json" >>"$out.jsonl"
			line <"$work/line.json"
		done
	done
	if [ "${#hog_pids[@]}" -gt 0 ]; then
		kill "${hog_pids[@]}"
		wait "${hog_pids[@]}" 2>/dev/null || true
		forget "${hog_pids[@]}"
		hog_pids=()
	fi
	rss "after $scenario" >>"$out-machine.txt"
done
loadavg "end" >>"$out-machine.txt"

{
	echo "# sluice serve --store redis vs envoyproxy/ratelimit"
	echo
	echo "bench/envoyrl.sh, $(date -u +%F). One redis-server for both, one load generator (sluice bench, Envoy RLS v3 over gRPC), one machine, alternating rounds."
	echo
	settings | sed 's/^/- /'
	echo "- $(grep -E '^sluice:' "$out-machine.txt")"
	echo "- load average at the start and end: $(grep -E '^(start|end): load' "$out-machine.txt" | sed 's/.*average //' | paste -sd'|' | sed 's/|/ → /')"
	echo "- throughput: Redis flushed before each run; the warm-up ($warmup) is a separate sluice bench run before the counters are read, so it is not included in the CPU figures; Redis's idle work is not subtracted."
	echo "- a decision is a request answered (one descriptor each); Redis CPU from redis-server's /proc/PID/stat (utime + stime, CLK_TCK $hz), INFO cpu as a cross-check."
	echo
	summarize "$out.jsonl"
} >"$out.md"
cat "$out.md"
echo
cat "$out-machine.txt"
