#!/usr/bin/env bash
# maxbytes.sh measures what --max-bytes bounds: sluice serve on the
# embedded store with a cap, under sluice bench load over far more keys
# than fit (sent once each first, --fill, then at random: each new key
# evicts an old one), with the memory limit
# sluice derives from the cap (the default) and without it (GOMEMLIMIT=off,
# as before sluice set one), in alternating rounds.
#
#   bench/maxbytes.sh     # ROUNDS=2 DURATION=20s MAX_BYTES=32MiB KEYS=3000000
#
# Per run: the peak RSS of the process (VmHWM), its RSS at the end, the
# store's estimate, keys and evictions (sluice_store_bytes, _keys,
# _evictions_total), the Go memory limit in force, requests/s and the
# server's CPU per request (more garbage collection is the price of a
# lower peak). Writes
# bench/results/DATE-maxbytes.jsonl and DATE-maxbytes-machine.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${ROUNDS:-2}
duration=${DURATION:-20s}
max_bytes=${MAX_BYTES:-32MiB}
keys=${KEYS:-3000000}

# shellcheck source=bench/lib.sh
. bench/lib.sh
bench_setup maxbytes
machine_facts >"$out-machine.txt"
echo "load: sluice bench over gRPC, 2 connections, 32 in flight, $keys keys, $duration; --max-bytes $max_bytes; $rounds rounds" >>"$out-machine.txt"
: >"$out.jsonl"
hz=$(getconf CLK_TCK)

run() { # round variant
	local round=$1 variant=$2 grpc http env=() pid t0 t1 stats
	pick_port grpc
	pick_port http
	[ "$variant" = nolimit ] && env=(GOMEMLIMIT=off)
	# --rlqs-max-bytes 1: no RLQS bucket (this load has none) and a memory
	# limit of the store's cap and headroom alone.
	env "${env[@]}" "$bin" serve --config "$work/rules.yaml" --max-bytes "$max_bytes" --rlqs-max-bytes 1 \
		--grpc-addr "127.0.0.1:$grpc" --http-addr "127.0.0.1:$http" --debug-addr "" \
		--log-level warn 2>"$work/serve.log" &
	pid=$!
	pids+=("$pid")
	ready "http://127.0.0.1:$http/readyz" "$work/serve.log"
	loadavg "round $round $variant" >>"$out-machine.txt"
	t0=$(cpu_ticks "$pid")
	stats=$("$bin" bench --target "127.0.0.1:$grpc" --json --connections 2 --concurrency 32 \
		--keys "$keys" --fill --duration "$duration")
	t1=$(cpu_ticks "$pid")
	local hwm rss limit
	hwm=$(awk '/VmHWM/ {print $2}' "/proc/$pid/status")
	rss=$(awk '/VmRSS/ {print $2}' "/proc/$pid/status")
	curl -fsS "127.0.0.1:$http/metrics" >"$work/metrics"
	metric() { awk -v n="$1" '$1 == n {print $2}' "$work/metrics"; }
	limit=$(metric go_gc_gomemlimit_bytes)
	kill "$pid"
	wait "$pid" || true
	echo "$stats" | jq -c --arg v "$variant" --argjson r "$round" --argjson hwm "$hwm" --argjson rss "$rss" \
		--arg limit "$limit" --argjson cpu "$(((t1 - t0) * 1000000 / hz))" \
		--arg sb "$(metric sluice_store_bytes)" --arg sk "$(metric sluice_store_keys)" --arg se "$(metric sluice_store_evictions_total)" \
		'{variant: $v, round: $r, peak_rss_kb: $hwm, end_rss_kb: $rss, go_memory_limit: ($limit | tonumber),
		  store_bytes: ($sb | tonumber), store_keys: ($sk | tonumber), evictions: ($se | tonumber),
		  rps, requests, server_cpu_us_per_req: ($cpu / .requests)}' | tee -a "$out.jsonl"
}

for round in $(seq "$rounds"); do
	if [ $((round % 2)) = 1 ]; then order="limit nolimit"; else order="nolimit limit"; fi
	for v in $order; do run "$round" "$v"; done
done
jq -s -r 'group_by(.variant)[] | "\(.[0].variant): peak RSS MB \(map(.peak_rss_kb / 1024 | round) | sort), end RSS MB \(map(.end_rss_kb / 1024 | round) | sort), store MB \(map(.store_bytes / 1048576 | round) | sort), req/s \(map(.rps | round) | sort), server CPU µs/req \(map(.server_cpu_us_per_req * 10 | round / 10) | sort)"' "$out.jsonl"
