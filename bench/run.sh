#!/usr/bin/env bash
# run.sh reproduces "The library" of docs/benchmarks.md: sluice's embedded store against the
# in-memory Go rate limiters, one workload, one test binary.
#
#   bench/run.sh                 # ROUNDS=6 BENCHTIME=1s SIDE_ROUNDS=3
#
# The machine is shared, so instead of -count=6 (six samples of one
# implementation back to back) it runs ROUNDS rounds of -count=1, each over
# every implementation: a burst of someone else's load then spreads over all
# of them instead of landing on one. benchstat takes the medians.
#
# Writes bench/results/DATE.txt (BenchmarkAllow at the default limit and
# BenchmarkBytesPerKey), DATE-rate100.txt (100 per second, burst 100),
# DATE-hour.txt (10000 per hour, burst 10000), DATE-machine.txt, and the
# benchstat tables in DATE-benchstat.txt.
set -euo pipefail
cd "$(dirname "$0")"

rounds=${ROUNDS:-6}
side_rounds=${SIDE_ROUNDS:-3}
benchtime=${BENCHTIME:-1s}
out=results/$(date -u +%F)
mkdir -p results

export PATH="$PATH:$(go env GOPATH)/bin"
command -v benchstat >/dev/null || go install golang.org/x/perf/cmd/benchstat@latest

{
	echo "date: $(date -u +%FT%TZ)"
	echo "nproc: $(nproc)"
	lscpu | grep 'Model name'
	free -g
	go version
	uname -srm
	echo "sluice: $(git -C .. rev-parse HEAD 2>/dev/null || echo unknown) $(git -C .. status --porcelain --untracked-files=no 2>/dev/null | grep -q . && echo "(dirty tree)")"
	go list -m golang.org/x/time github.com/sethvargo/go-limiter \
		github.com/throttled/throttled/v2 github.com/ulule/limiter/v3
} >"$out-machine.txt"

loadavg() { echo "$1 load average: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$out-machine.txt"; }

run() { # file, rounds, go test arguments...
	local file=$1 n=$2
	shift 2
	: >"$file"
	for i in $(seq "$n"); do
		loadavg "$file round $i start"
		go test -run '^$' -benchtime="$benchtime" -count=1 -timeout 60m "$@" | tee -a "$file"
	done
	loadavg "$file end"
}

run "$out.txt" "$rounds" -bench '^Benchmark(Allow|BytesPerKey)$'
run "$out-rate100.txt" "$side_rounds" -bench '^BenchmarkAllow$' -rate=100 -period=1s
run "$out-hour.txt" "$side_rounds" -bench '^BenchmarkAllow$' -rate=10000 -period=1h

{
	echo "== $out.txt"
	benchstat "$out.txt"
	for pair in "sluice-token_bucket OR xrate-sharded" \
		"sluice-token_bucket OR sethvargo-go-limiter" \
		"sluice-gcra OR throttled-gcra" \
		"sluice-fixed_window OR ulule-limiter"; do
		echo "== $out.txt: $pair"
		benchstat -filter "/impl:($pair)" -col /impl "$out.txt"
	done
	for side in rate100 hour; do
		echo "== $out-$side.txt"
		benchstat "$out-$side.txt"
	done
} | tee "$out-benchstat.txt"
