#!/usr/bin/env bash
# tokens.sh measures what a token budget adds to a request through sluice
# proxy: two proxies built from this tree, with the same route
# (POST /v1/chat/completions, limited per API key) in front of the same
# upstream, sluice nullapi --openai (answers at once, with usage), one
# route with a token budget (tokens: reserve from the body, settle from the
# answer's usage, enforce) and one without, in alternating rounds. The
# same chat request, about 1 KB of JSON asking max_tokens 256, every time.
#
#   bench/tokens.sh        # ROUNDS=5 DURATION=10s WARMUP=2s CONNECTIONS=2
#                          # CONCURRENCY=32 SCENARIOS="one 10k" STORE=memory
#
# Scenarios: one, every request with the one API key (one key of each
# limit); 10k, 10,000 API keys chosen uniformly. STORE=redis runs both
# proxies on a redis-server started here on a free port (the settlement
# is then one script call on Redis). Limits are far above what
# a run spends: every request is decided, proxied and settled.
#
# Writes bench/results/DATE-tokens[-redis].jsonl (one sluice bench --json
# line per run, with the CPU time per request of the proxy measured),
# -machine.txt (machine, load average before each run) and .md (medians,
# and the per-round ratios of the proxy with tokens over the one without).
set -euo pipefail
cd "$(dirname "$0")/.."

rounds=${ROUNDS:-5}
duration=${DURATION:-10s}
warmup=${WARMUP:-2s}
connections=${CONNECTIONS:-2}
concurrency=${CONCURRENCY:-32}
scenarios=${SCENARIOS:-one 10k}
store=${STORE:-memory}

# shellcheck source=bench/lib.sh
. bench/lib.sh
name=tokens
[ "$store" = redis ] && name=tokens-redis
bench_setup "$name"

pick_port up_port
pick_port plain_port
pick_port tok_port
pick_port plain_admin
pick_port tok_admin
upstream=127.0.0.1:$up_port

store_flags=(--store "$store")
if [ "$store" = redis ]; then
	pick_port redis_port
	redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no >"$work/redis.log" 2>&1 &
	pids+=("$!")
	for _ in $(seq 50); do redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break; sleep 0.1; done
	store_flags+=(--redis-url "127.0.0.1:$redis_port")
fi

rules() { # with tokens: yes or no
	cat <<YAML
domain: llm
http:
  routes:
    - pattern: "POST /v1/chat/completions"
      descriptors: [[{key: api_key, api_key: Authorization}]]
YAML
	if [ "$1" = yes ]; then
		cat <<'YAML'
      tokens:
        descriptor: [{key: api_key_tokens, api_key: Authorization}]
        reserve: {default: 512, max: 4096, prompt: bytes}
        enforce: true
YAML
	fi
	cat <<'YAML'
descriptors:
  - key: api_key
    rate_limit: {unit: day, requests_per_unit: 1000000000}
  - key: api_key_tokens
    rate_limit: {unit: day, requests_per_unit: 1000000000000}
YAML
}
rules no >"$work/plain.yaml"
rules yes >"$work/tokens.yaml"
"$bin" check --config "$work/plain.yaml"
"$bin" check --config "$work/tokens.yaml"

body='{"model":"m","max_tokens":256,"messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"'
body+=$(printf 'lorem ipsum %.0s' $(seq 75))
body+='"}]}'

"$bin" nullapi --openai --listen "$upstream" 2>"$work/nullapi.log" &
upstream_pid=$!
pids+=("$upstream_pid")
"$bin" proxy --config "$work/plain.yaml" --upstream "http://$upstream" --listen "127.0.0.1:$plain_port" \
	--admin-listen "127.0.0.1:$plain_admin" --log-format json "${store_flags[@]}" 2>"$work/plain.log" &
plain_pid=$!
pids+=("$plain_pid")
"$bin" proxy --config "$work/tokens.yaml" --upstream "http://$upstream" --listen "127.0.0.1:$tok_port" \
	--admin-listen "127.0.0.1:$tok_admin" --log-format json "${store_flags[@]}" 2>"$work/tokens.log" &
tok_pid=$!
pids+=("$tok_pid")
logs=("$work/nullapi.log" "$work/plain.log" "$work/tokens.log")
ready "http://127.0.0.1:$plain_admin/readyz" "${logs[@]}"
ready "http://127.0.0.1:$tok_admin/readyz" "${logs[@]}"

server_pid() { if [ "$1" = plain ]; then echo "$plain_pid"; else echo "$tok_pid"; fi; }
target() { if [ "$1" = plain ]; then echo "127.0.0.1:$plain_port"; else echo "127.0.0.1:$tok_port"; fi; }
flags() { # scenario
	case "$1" in
	one) echo "--keys 1" ;;
	10k) echo "--keys 10000" ;;
	*)
		echo "tokens.sh: unknown scenario $1" >&2
		exit 2
		;;
	esac
}

{
	machine_facts
	echo "store $store, $connections connection(s), $concurrency in flight, warmup $warmup, duration $duration, $rounds rounds, body ${#body} bytes"
} >"$out-machine.txt"

bench() { # server scenario round
	local server=$1 scenario=$2 round=$3 pid before
	pid=$(server_pid "$server")
	before=$(cpu_ticks "$pid")
	# shellcheck disable=SC2046
	"$bin" bench --json --mode http --target "$(target "$server")" --path /v1/chat/completions \
		--header Authorization --body "$body" \
		--connections "$connections" --concurrency "$concurrency" \
		--warmup "$warmup" --duration "$duration" $(flags "$scenario") >"$work/run.json"
	jq -c --arg scenario "$scenario" --arg server "$server" --argjson round "$round" \
		--argjson ticks "$(($(cpu_ticks "$pid") - before))" --argjson hz "$(getconf CLK_TCK)" \
		'{scenario: $scenario, server: $server, round: $round} + . +
		 {proxy_cpu_us_per_req: ($ticks / $hz * 1e6 / (.requests + .warmup_requests))}' "$work/run.json"
}

: >"$out.jsonl"
for round in $(seq "$rounds"); do
	for scenario in $scenarios; do
		order="plain tokens"
		if [ $((round % 2)) = 0 ]; then order="tokens plain"; fi
		for server in $order; do
			loadavg "$scenario round $round $server" >>"$out-machine.txt"
			bench "$server" "$scenario" "$round" | tee -a "$out.jsonl" |
				jq -r '"\(.scenario) round \(.round) \(.server): \(.rps|floor) req/s p50 \(.p50_us)µs p99 \(.p99_us)µs ok \(.ok) over \(.over_limit) errors \(.errors) proxy cpu \(.proxy_cpu_us_per_req|floor)µs/req"'
		done
	done
done

jq -s -r '
	def median: sort | if length % 2 == 1 then .[length / 2 | floor] else (.[length / 2 - 1] + .[length / 2]) / 2 end;
	def r(n): . * n | round / n;
	def med(f): map(f) | median;
	def row: {rps: med(.rps), p50: med(.p50_us), p99: med(.p99_us), cpu: med(.proxy_cpu_us_per_req),
		ok: (map(.ok) | add), over: (map(.over_limit) | add), errors: (map(.errors) | add)};
	def line($name): "| \(.scenario) | \($name) | \(.[$name].rps | round) | \(.[$name].p50 | r(1)) | \(.[$name].p99 | r(1)) | \(.[$name].cpu | r(10)) | \(.[$name].ok) / \(.[$name].over) / \(.[$name].errors) |";
	group_by(.scenario) | map({scenario: .[0].scenario,
		plain: (map(select(.server == "plain")) | row), tokens: (map(select(.server == "tokens")) | row),
		rounds: (map(select(.server == "plain")) | length),
		per_round: (group_by(.round) | map((map(select(.server == "tokens"))[0].rps) / (map(select(.server == "plain"))[0].rps) | r(100))),
		cpu_per_round: (group_by(.round) | map((map(select(.server == "tokens"))[0].proxy_cpu_us_per_req) - (map(select(.server == "plain"))[0].proxy_cpu_us_per_req) | r(10)))}) |
	(["| scenario | route | req/s | p50 µs | p99 µs | proxy CPU µs/req | ok / over / errors |", "|---|---|---:|---:|---:|---:|---|"] +
	 map(line("plain"), line("tokens")) +
	 ["", "| scenario | rounds | tokens/plain req/s | per round | tokens − plain proxy CPU µs/req | per round |", "|---|---:|---:|---|---:|---|"] +
	 map("| \(.scenario) | \(.rounds) | \(.tokens.rps / .plain.rps | r(100)) | \(.per_round | map(tostring) | join(" ")) | \(.tokens.cpu - .plain.cpu | r(10)) | \(.cpu_per_round | map(tostring) | join(" ")) |")) |
	.[]' "$out.jsonl" | tee "$out.md"
echo
cat "$out-machine.txt"
