#!/usr/bin/env bash
# proxy.sh reproduces "sluice proxy against a plain reverse proxy" in
# docs/benchmarks.md: the same HTTP load from sluice bench --mode http, on
# the same machine, against sluice plainproxy (an httputil.ReverseProxy with
# only SetURL, and sluice proxy's transport, flush interval and server
# settings) and against sluice proxy (embedded store, metrics on), both in
# front of the same upstream, sluice nullapi (answers every request 200 with
# a 59-byte JSON body at once), in alternating rounds.
#
#   bench/proxy.sh        # ROUNDS=5 DURATION=10s WARMUP=2s CONNECTIONS=2
#                         # CONCURRENCY=32 SCENARIOS="one 10k"
#
# Scenarios (GET requests; nothing is ever denied):
#   one   GET /one: the route limits by client address, and every request
#         comes from 127.0.0.1, so one key
#   10k   GET /keys with X-Key: k<i>, 10,000 values chosen uniformly: the
#         route limits by that header, so 10,000 keys
#
# B_REV=rev compares sluice proxy before and after a change instead: the
# plain proxy is replaced by sluice proxy built from that revision (git
# archive, not checked out), "sluice-b", on the same port, with the same
# flags, and the tables compare sluice with sluice-b
# (DATE-proxy-b.jsonl, .md).
#
# Each round runs every scenario against both proxies, the plain one first
# in odd rounds and sluice first in even ones, so that a burst of someone
# else's load on this shared machine spreads over both. The three servers
# run the whole time (one proxy idle while the other is measured), all
# built from this tree, on 127.0.0.1 only. Nothing is pinned to a CPU.
#
# Writes bench/results/DATE-proxy.jsonl (one sluice bench --json line per
# run, plus scenario, server, round, and the CPU time per request of the
# proxy measured and of the upstream, from /proc/PID/stat, warm-up
# included), DATE-proxy-machine.txt (machine, load average before each
# run, RSS of both proxies) and DATE-proxy.md (medians and ratios).
set -euo pipefail
cd "$(dirname "$0")/.."

rounds=${ROUNDS:-5}
duration=${DURATION:-10s}
warmup=${WARMUP:-2s}
connections=${CONNECTIONS:-2}
concurrency=${CONCURRENCY:-32}
scenarios=${SCENARIOS:-one 10k}

upstream=127.0.0.1:${UPSTREAM_PORT:-28280}
plain=127.0.0.1:${PLAIN_PORT:-28180}
sluice=127.0.0.1:${SLUICE_PORT:-28190}
admin=127.0.0.1:${ADMIN_PORT:-28191}

# shellcheck source=bench/lib.sh
. bench/lib.sh
bench_setup "proxy"
b_rev=${B_REV:-}
base=plain
if [ -n "$b_rev" ]; then
	base=sluice-b
	out=$out-b
	mkdir "$work/b"
	git archive "$b_rev" | tar -x -C "$work/b"
	(cd "$work/b" && go build -o "$work/sluice-b" ./cmd/sluice)
fi

# Limits far above what a run sends: every request is decided and
# proxied.
cat >"$work/proxy.yaml" <<'EOF'
domain: bench
http:
  routes:
    - pattern: /one
      name: one
    - pattern: /keys
      name: keys
      descriptors: [[{key: key, header: X-Key}]]
descriptors:
  - key: remote_address
    rate_limit: {unit: day, requests_per_unit: 1000000000}
  - key: key
    rate_limit: {unit: day, requests_per_unit: 1000000000}
EOF
"$bin" check --config "$work/proxy.yaml"

"$bin" nullapi --listen "$upstream" 2>"$work/nullapi.log" &
upstream_pid=$!
pids+=("$upstream_pid")
if [ -n "$b_rev" ]; then
	pick_port admin_b
	"$work/sluice-b" proxy --config "$work/proxy.yaml" --upstream "http://$upstream" --listen "$plain" \
		--admin-listen "127.0.0.1:$admin_b" --log-format json 2>"$work/plain.log" &
else
	"$bin" plainproxy --listen "$plain" --upstream "http://$upstream" 2>"$work/plain.log" &
fi
plain_pid=$!
pids+=("$plain_pid")
"$bin" proxy --config "$work/proxy.yaml" --upstream "http://$upstream" --listen "$sluice" \
	--admin-listen "$admin" --log-format json 2>"$work/proxy.log" &
sluice_pid=$!
pids+=("$sluice_pid")

logs=("$work/nullapi.log" "$work/plain.log" "$work/proxy.log")
ready "http://$upstream/" "${logs[@]}"
ready "http://$plain/one" "${logs[@]}"
ready "http://$admin/readyz" "${logs[@]}"
ready "http://$sluice/one" "${logs[@]}"

server_pid() { # server
	if [ "$1" = "$base" ]; then echo "$plain_pid"; else echo "$sluice_pid"; fi
}
rss() { # label
	local s
	for s in $base sluice; do
		echo "$1: $s VmRSS $(awk '/VmRSS/ {print $2, $3}' "/proc/$(server_pid $s)/status"), VmHWM $(awk '/VmHWM/ {print $2, $3}' "/proc/$(server_pid $s)/status")"
	done
}

{
	machine_facts
	echo "$connections connection(s), $concurrency in flight, warmup $warmup, duration $duration, $rounds rounds"
	rss "start"
} >"$out-machine.txt"

target() { # server
	if [ "$1" = "$base" ]; then echo "$plain"; else echo "$sluice"; fi
}

flags() { # scenario
	case "$1" in
	one) echo "--path /one" ;;
	10k) echo "--path /keys --header X-Key --keys 10000" ;;
	*)
		echo "proxy.sh: unknown scenario $1" >&2
		exit 2
		;;
	esac
}

bench() { # server scenario round
	local server=$1 scenario=$2 round=$3 pid before up_before
	pid=$(server_pid "$server")
	before=$(cpu_ticks "$pid")
	up_before=$(cpu_ticks "$upstream_pid")
	# shellcheck disable=SC2046
	"$bin" bench --json --mode http --target "$(target "$server")" \
		--connections "$connections" --concurrency "$concurrency" \
		--warmup "$warmup" --duration "$duration" $(flags "$scenario") >"$work/run.json"
	# CPU time over the whole run (warm-up included) per request answered:
	# less sensitive to other load on the machine than requests per
	# second.
	jq -c --arg scenario "$scenario" --arg server "$server" --argjson round "$round" \
		--argjson ticks "$(($(cpu_ticks "$pid") - before))" \
		--argjson up_ticks "$(($(cpu_ticks "$upstream_pid") - up_before))" --argjson hz "$(getconf CLK_TCK)" \
		'{scenario: $scenario, server: $server, round: $round} + . +
		 {proxy_cpu_us_per_req: ($ticks / $hz * 1e6 / (.requests + .warmup_requests)),
		  upstream_cpu_us_per_req: ($up_ticks / $hz * 1e6 / (.requests + .warmup_requests))}' "$work/run.json"
}

: >"$out.jsonl"
for round in $(seq "$rounds"); do
	for scenario in $scenarios; do
		order="$base sluice"
		if [ $((round % 2)) = 0 ]; then
			order="sluice $base"
		fi
		for server in $order; do
			loadavg "$scenario round $round $server" >>"$out-machine.txt"
			bench "$server" "$scenario" "$round" | tee -a "$out.jsonl" |
				jq -r '"\(.scenario) round \(.round) \(.server): \(.rps|floor) req/s p50 \(.p50_us)µs p99 \(.p99_us)µs ok \(.ok) over \(.over_limit) errors \(.errors) proxy cpu \(.proxy_cpu_us_per_req|floor)µs/req"'
		done
	done
done
rss "end" >>"$out-machine.txt"
curl -fsS "http://$admin/metrics" | grep '^sluice_proxy_requests_total' | grep -v ' 0$' >>"$out-machine.txt"

# Medians across rounds, and sluice over plain.
jq -s -r --arg base "$base" '
	def median: sort | if length % 2 == 1 then .[length / 2 | floor] else (.[length / 2 - 1] + .[length / 2]) / 2 end;
	def r(n): . * n | round / n;
	def med(f): map(f) | median;
	def row: {rps: med(.rps), p50: med(.p50_us), p99: med(.p99_us), p999: med(.p999_us),
		cpu: med(.proxy_cpu_us_per_req), up: med(.upstream_cpu_us_per_req),
		ok: (map(.ok) | add), over: (map(.over_limit) | add), errors: (map(.errors) | add)};
	def line($name): "| \(.scenario) | \($name) | \(.[$name].rps | round) | \(.[$name].p50 | r(1)) | \(.[$name].p99 | r(1)) | \(.[$name].p999 | r(1)) | \(.[$name].cpu | r(10)) | \(.[$name].up | r(10)) | \(.[$name].ok) / \(.[$name].over) / \(.[$name].errors) |";
	group_by(.scenario) | map({scenario: .[0].scenario,
		($base): (map(select(.server == $base)) | row), sluice: (map(select(.server == "sluice")) | row),
		rounds: (map(select(.server == $base)) | length),
		per_round: (group_by(.round) | map((map(select(.server == "sluice"))[0].rps) / (map(select(.server == $base))[0].rps) | r(100))),
		cpu_per_round: (group_by(.round) | map((map(select(.server == "sluice"))[0].proxy_cpu_us_per_req) / (map(select(.server == $base))[0].proxy_cpu_us_per_req) | r(100)))}) |
	(["| scenario | proxy | req/s | p50 µs | p99 µs | p99.9 µs | proxy CPU µs/req | upstream CPU µs/req | ok / over / errors |", "|---|---|---:|---:|---:|---:|---:|---:|---|"] +
	 map(line($base), line("sluice")) +
	 ["", "| scenario | rounds | sluice/\($base) req/s\(if $base == "plain" then " (target >= 0.90)" else "" end) | per round | sluice/\($base) p99 | sluice/\($base) proxy CPU per request | per round |", "|---|---:|---:|---|---:|---:|---|"] +
	 map("| \(.scenario) | \(.rounds) | \(.sluice.rps / .[$base].rps | r(100)) | \(.per_round | map(tostring) | join(" ")) | \(.sluice.p99 / .[$base].p99 | r(100)) | \(.sluice.cpu / .[$base].cpu | r(100)) | \(.cpu_per_round | map(tostring) | join(" ")) |")) |
	.[]' "$out.jsonl" | tee "$out.md"
echo
cat "$out-machine.txt"
