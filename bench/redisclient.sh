#!/usr/bin/env bash
# redisclient.sh reproduces "Redis client: rueidis vs go-redis" in
# docs/benchmarks.md: BenchmarkRedisClient (redisclient_test.go), one EVALSHA
# of a GCRA-like script per decision on 10k keys, at 1, 8 and 64 goroutines
# per core, against a redis-server the benchmark starts on a free loopback port.
#
#   bench/redisclient.sh          # ROUNDS=8 SIDE_ROUNDS=4 BENCHTIME=1s
#
# Needs redis-server on the PATH (Debian: apt-get install redis-server).
# As run.sh, it runs ROUNDS rounds of -count=1 over every client rather than
# -count=ROUNDS, so that a burst of other load on this shared machine spreads
# over all of them; benchstat takes the medians.
#
# Writes bench/results/DATE-redisclient.txt (library defaults),
# DATE-redisclient-pool128.txt (go-redis with one connection per goroutine at
# the highest parallelism), DATE-redisclient-machine.txt and the benchstat
# tables in DATE-redisclient-benchstat.txt.
set -euo pipefail
cd "$(dirname "$0")"

rounds=${ROUNDS:-8}
side_rounds=${SIDE_ROUNDS:-4}
benchtime=${BENCHTIME:-1s}
out=results/$(date -u +%F)-redisclient
mkdir -p results

command -v redis-server >/dev/null || {
	echo "redis-server not found: apt-get install redis-server" >&2
	exit 1
}
export PATH="$PATH:$(go env GOPATH)/bin"
command -v benchstat >/dev/null || go install golang.org/x/perf/cmd/benchstat@latest

bin=$(mktemp -d)/bench.test
trap 'rm -rf "$(dirname "$bin")"' EXIT
go test -c -o "$bin" .

{
	echo "date: $(date -u +%FT%TZ)"
	echo "nproc: $(nproc)"
	lscpu | grep 'Model name'
	free -g
	go version
	uname -srm
	redis-server --version
	echo "sluice: $(git -C .. rev-parse HEAD 2>/dev/null || echo unknown)"
	go list -m github.com/redis/rueidis github.com/redis/go-redis/v9
} >"$out-machine.txt"

loadavg() { echo "$1 load average: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$out-machine.txt"; }

run() { # file, rounds, benchmark arguments...
	local file=$1 n=$2
	shift 2
	: >"$file"
	for i in $(seq "$n"); do
		loadavg "$file round $i start"
		"$bin" -test.run '^$' -test.bench 'RedisClient' -test.benchtime="$benchtime" \
			-test.count=1 -test.timeout=60m -redis "$@" | tee -a "$file"
	done
	loadavg "$file end"
}

run "$out.txt" "$rounds"
run "$out-pool128.txt" "$side_rounds" -test.bench 'RedisClient/client=goredis$' -redis-goredis-pool=128

{
	echo "== $out.txt"
	benchstat -col /client "$out.txt"
	echo "== $out.txt: the pipelining clients"
	benchstat -filter '/client:(rueidis OR rueidis-flush20us OR goredis-autopipeline)' -col /client "$out.txt"
	echo "== $out-pool128.txt: go-redis, PoolSize 128"
	benchstat "$out-pool128.txt"
} | tee "$out-benchstat.txt"
