#!/usr/bin/env bash
# serve.sh reproduces "sluice serve against a server that does nothing" in
# docs/benchmarks.md: the same load from sluice bench, on the same machine,
# against sluice nullserver (answers OK at once, decides nothing) and
# against sluice serve with the embedded store, in alternating rounds.
#
#   bench/serve.sh        # ROUNDS=5 DURATION=10s WARMUP=2s CONNECTIONS=2
#                         # CONCURRENCY=32 MODE=grpc SCENARIOS="10k hot hot10 1m"
#
# Scenarios (every request one descriptor {key: <value>} in domain bench):
#   10k    10,000 keys, chosen uniformly, all within their limit
#   hot    every request on the one key "hot", which is over its limit
#   hot10  10% of the requests on "hot", the rest over 10,000 keys
#   1m     1,000,000 keys, all filled into the store before the rounds
#
# Each round runs every scenario against both servers, the null server
# first in odd rounds and sluice first in even ones, so that a burst of
# someone else's load on this shared machine spreads over both. The two
# servers run side by side the whole time (one idle while the other is
# measured). Both are built from this tree and listen on 127.0.0.1 only.
#
# Writes (with MODE=json, DATE-serve-json.*) bench/results/DATE-serve.jsonl (one sluice bench --json line per
# run, plus scenario, server and round), DATE-serve-machine.txt (machine,
# load average, RSS of sluice serve) and DATE-serve.md (medians, ratios).
# Each line also has the server's CPU time per request (server_cpu_us_per_req,
# from /proc/PID/stat), which other load on the machine disturbs less than
# requests per second. PROFILE=1 also takes a 10s CPU profile of sluice
# serve under each scenario's load after its rounds, into
# DATE-serve-cpu-SCENARIO.pprof, summarised in DATE-serve-cpu-SCENARIO.txt.
set -euo pipefail
cd "$(dirname "$0")/.."

rounds=${ROUNDS:-5}
duration=${DURATION:-10s}
warmup=${WARMUP:-2s}
connections=${CONNECTIONS:-2}
concurrency=${CONCURRENCY:-32}
mode=${MODE:-grpc}
scenarios=${SCENARIOS:-10k hot hot10 1m}
profile=${PROFILE:-0}

null_grpc=127.0.0.1:${NULL_GRPC_PORT:-28081}
null_http=127.0.0.1:${NULL_HTTP_PORT:-28080}
sluice_grpc=127.0.0.1:${SLUICE_GRPC_PORT:-28091}
sluice_http=127.0.0.1:${SLUICE_HTTP_PORT:-28090}
sluice_debug=127.0.0.1:${SLUICE_DEBUG_PORT:-28070}

# shellcheck source=bench/lib.sh
. bench/lib.sh
bench_setup "serve"

"$bin" nullserver --grpc-addr "$null_grpc" --http-addr "$null_http" 2>"$work/null.log" &
null_pid=$!
pids+=("$null_pid")
"$bin" serve --config "$work/rules.yaml" --grpc-addr "$sluice_grpc" --http-addr "$sluice_http" \
	--debug-addr "$sluice_debug" --log-format json 2>"$work/serve.log" &
sluice_pid=$!
pids+=("$sluice_pid")

ready "http://$null_http/healthz" "$work/null.log" "$work/serve.log"
ready "http://$sluice_http/readyz" "$work/null.log" "$work/serve.log"

rss() { echo "$1: sluice serve VmRSS $(awk '/VmRSS/ {print $2, $3}' /proc/$sluice_pid/status), VmHWM $(awk '/VmHWM/ {print $2, $3}' /proc/$sluice_pid/status)"; }

{
	machine_facts
	echo "mode $mode, $connections connection(s), $concurrency in flight, warmup $warmup, duration $duration, $rounds rounds"
	rss "start"
} >"$out-machine.txt"

target() { # server
	case "$1,$mode" in
	null,grpc) echo "$null_grpc" ;;
	null,json) echo "$null_http" ;;
	sluice,grpc) echo "$sluice_grpc" ;;
	sluice,json) echo "$sluice_http" ;;
	esac
}

server_pid() { # server
	if [ "$1" = null ]; then echo "$null_pid"; else echo "$sluice_pid"; fi
}

bench() { # server scenario round [extra flags]
	local server=$1 scenario=$2 round=$3 pid before
	shift 3
	pid=$(server_pid "$server")
	before=$(cpu_ticks "$pid")
	# shellcheck disable=SC2046
	"$bin" bench --json --mode "$mode" --target "$(target "$server")" \
		--connections "$connections" --concurrency "$concurrency" \
		--warmup "$warmup" --duration "$duration" $(rls_flags "$scenario") "$@" >"$work/run.json"
	# The server's CPU time over the whole run (warm-up included) per
	# request it answered: less sensitive to other load on the machine
	# than requests per second.
	jq -c --arg scenario "$scenario" --arg server "$server" --argjson round "$round" \
		--argjson ticks "$(($(cpu_ticks "$pid") - before))" --argjson hz "$(getconf CLK_TCK)" \
		'{scenario: $scenario, server: $server, round: $round} + . +
		 {server_cpu_us_per_req: ($ticks / $hz * 1e6 / (.requests + .warmup_requests))}' "$work/run.json"
}

: >"$out.jsonl"
for scenario in $scenarios; do
	if [ "$scenario" = 1m ]; then
		rss "before filling 1M keys" >>"$out-machine.txt"
		"$bin" bench --mode "$mode" --target "$(target sluice)" --connections "$connections" \
			--concurrency "$concurrency" --keys 1000000 --fill --warmup 0 --duration 0 --requests 1 \
			>>"$out-machine.txt"
		rss "after filling 1M keys" >>"$out-machine.txt"
	fi
	for round in $(seq "$rounds"); do
		order="null sluice"
		if [ $((round % 2)) = 0 ]; then
			order="sluice null"
		fi
		for server in $order; do
			loadavg "$scenario round $round $server" >>"$out-machine.txt"
			bench "$server" "$scenario" "$round" | tee -a "$out.jsonl" |
				jq -r '"\(.scenario) round \(.round) \(.server): \(.rps|floor) req/s p50 \(.p50_us)µs p99 \(.p99_us)µs p99.9 \(.p999_us)µs ok \(.ok) over \(.over_limit) errors \(.errors) server cpu \(.server_cpu_us_per_req|floor)µs/req"'
		done
	done
	if [ "$scenario" = 1m ]; then
		rss "after the 1M rounds" >>"$out-machine.txt"
	fi
	if [ "$profile" = 1 ]; then
		bench sluice "$scenario" 0 --duration 14s >/dev/null &
		bench_pid=$!
		sleep 3
		curl -fsS -o "$out-cpu-$scenario.pprof" "http://$sluice_debug/debug/pprof/profile?seconds=10"
		wait "$bench_pid"
		{
			go tool pprof -top -nodecount=40 "$bin" "$out-cpu-$scenario.pprof"
			go tool pprof -top -cum -nodecount=60 "$bin" "$out-cpu-$scenario.pprof"
		} >"$out-cpu-$scenario.txt" 2>&1
	fi
done
rss "end" >>"$out-machine.txt"

# Medians across rounds, and sluice over null.
jq -s -r '
	def median: sort | if length % 2 == 1 then .[length / 2 | floor] else (.[length / 2 - 1] + .[length / 2]) / 2 end;
	def r(n): . * n | round / n;
	group_by(.scenario) | map(
		(map(select(.server == "null"))) as $n | (map(select(.server == "sluice"))) as $s |
		{scenario: .[0].scenario,
		 null: {rps: ($n | map(.rps) | median), p50: ($n | map(.p50_us) | median), p99: ($n | map(.p99_us) | median), p999: ($n | map(.p999_us) | median), cpu: ($n | map(.server_cpu_us_per_req) | median)},
		 sluice: {rps: ($s | map(.rps) | median), p50: ($s | map(.p50_us) | median), p99: ($s | map(.p99_us) | median), p999: ($s | map(.p999_us) | median), cpu: ($s | map(.server_cpu_us_per_req) | median),
		          ok: ($s | map(.ok) | add), over: ($s | map(.over_limit) | add), errors: ($s | map(.errors) | add)},
		 rounds: ($n | length)}) |
	(["| scenario | server | req/s | p50 µs | p99 µs | p99.9 µs | server CPU µs/req |", "|---|---|---:|---:|---:|---:|---:|"] +
	 map("| \(.scenario) | null | \(.null.rps | round) | \(.null.p50 | r(1)) | \(.null.p99 | r(1)) | \(.null.p999 | r(1)) | \(.null.cpu | r(10)) |",
	     "| \(.scenario) | sluice | \(.sluice.rps | round) | \(.sluice.p50 | r(1)) | \(.sluice.p99 | r(1)) | \(.sluice.p999 | r(1)) | \(.sluice.cpu | r(10)) |") +
	 ["", "| scenario | rounds | sluice/null req/s (target >= 0.90) | sluice/null p99 (target <= 1.5) | sluice/null CPU per request | sluice ok / over / errors |", "|---|---:|---:|---:|---:|---|"] +
	 map("| \(.scenario) | \(.rounds) | \(.sluice.rps / .null.rps | r(100)) | \(.sluice.p99 / .null.p99 | r(100)) | \(.sluice.cpu / .null.cpu | r(100)) | \(.sluice.ok) / \(.sluice.over) / \(.sluice.errors) |")) |
	.[]' "$out.jsonl" | tee "$out.md"
echo
cat "$out-machine.txt"
