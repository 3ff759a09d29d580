# lib.sh holds the setup that bench/serve.sh and bench/redis.sh share; they
# source it after reading their settings (mode, and the result name).
#
# bench_setup NAME: sets out (bench/results/DATE-NAME, -MODE unless gRPC),
# work (a temporary directory), bin (sluice built from this tree) and
# writes $work/rules.yaml, the rules of every scenario: within the limit,
# one counter per key for a day, far above what a run sends; over the
# limit, the key "hot", 100 per second. The pids array collects the
# processes to stop; cleanup (trapped on exit) stops them and removes work.
bench_setup() {
	out=bench/results/$(date -u +%F)-$1
	if [ "$mode" != grpc ]; then
		out=$out-$mode
	fi
	mkdir -p bench/results
	work=$(mktemp -d)
	bin=$work/sluice
	go build -o "$bin" ./cmd/sluice

	cat >"$work/rules.yaml" <<'EOF'
domain: bench
descriptors:
  - key: key
    value: hot
    rate_limit: {unit: second, requests_per_unit: 100}
  - key: key
    rate_limit: {unit: day, requests_per_unit: 1000000000}
EOF
	"$bin" check --config "$work/rules.yaml"

	pids=()
	trap cleanup EXIT
}

cleanup() {
	for pid in "${pids[@]}"; do
		kill "$pid" 2>/dev/null || true
	done
	wait 2>/dev/null || true
	rm -rf "$work"
}
