# lib.sh holds the setup that bench/serve.sh, bench/redis.sh and
# bench/proxy.sh share; they source it after reading their settings (mode,
# and the result name). Besides bench_setup it has machine_facts, loadavg,
# cpu_ticks, ready, rls_flags and pick_port (below).
#
# bench_setup NAME: sets out (bench/results/DATE-NAME, -MODE when a mode
# other than gRPC is set), work (a temporary directory), bin (sluice built
# from this tree) and writes $work/rules.yaml, the rules of every
# scenario: within the limit, one counter per key for a day, far above
# what a run sends; over the limit, the key "hot", 100 per second. With
# LEASE set (e.g. LEASE=1%), every limit has consistency: lease and that
# max_overshoot (docs/leases.md): the Redis-backed server decides from
# leases. The pids array collects the
# processes to stop; cleanup (trapped on exit) stops them and removes work.
bench_setup() {
	out=bench/results/$(date -u +%F)-$1
	if [ "${mode:-grpc}" != grpc ]; then
		out=$out-$mode
	fi
	mkdir -p bench/results
	work=$(mktemp -d)
	bin=$work/sluice
	go build -o "$bin" ./cmd/sluice

	{
		echo "domain: bench"
		if [ -n "${LEASE:-}" ]; then
			echo "consistency: lease"
			echo "max_overshoot: $LEASE"
		fi
	} >"$work/rules.yaml"
	cat >>"$work/rules.yaml" <<'EOF'
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

# machine_facts prints the machine, the toolchain and the commit measured.
machine_facts() {
	echo "date: $(date -u +%FT%TZ)"
	echo "nproc: $(nproc)"
	lscpu | grep 'Model name'
	free -g | head -2
	go version
	uname -srm
	# bench/results is left out: the script is writing there.
	echo "sluice: $(git rev-parse HEAD 2>/dev/null || echo unknown) $(git status --porcelain -- . ':!bench/results' 2>/dev/null | grep -q . && echo "(dirty tree)")"
}

loadavg() { echo "$1: load average $(cut -d' ' -f1-3 /proc/loadavg)"; }

cpu_ticks() { # pid: user + system time in clock ticks
	awk '{print $14 + $15}' "/proc/$1/stat"
}

# ready URL LOG...: waits up to 10 s for URL to answer 2xx; otherwise
# prints the logs and fails.
ready() {
	local url=$1 _
	shift
	for _ in $(seq 100); do
		curl -fsS -o /dev/null "$url" 2>/dev/null && return 0
		sleep 0.1
	done
	echo "$url not ready" >&2
	cat "$@" >&2
	return 1
}

# rls_flags SCENARIO prints the sluice bench flags of an RLS scenario of
# serve.sh, redis.sh and envoyrl.sh: 10k keys within the limit, hot (every
# request the over-limit key), hot10 (one in ten), 1m keys; log500 and
# log10k, envoyrl.sh's long sliding logs (100 and 10 keys).
rls_flags() {
	case "$1" in
	10k) echo "--keys 10000" ;;
	hot) echo "--keys 10000 --hot 1" ;;
	hot10) echo "--keys 10000 --hot 0.1" ;;
	1m) echo "--keys 1000000" ;;
	log500) echo "--keys 100" ;;  # bench/envoyrl.sh: filled to 500 hits a key first
	log10k) echo "--keys 10" ;;   # and 10,000
	*)
		echo "${0##*/}: unknown scenario $1" >&2
		exit 2
		;;
	esac
}

# pick_port VAR sets VAR to a TCP port that no socket uses, not one it gave
# before, below the range the kernel picks outgoing ports from (so that a
# client's connection cannot take it before the server binds it). It sets
# a variable rather than printing, so that it runs in the calling shell
# (not in the subshell of $(...)) and remembers the ports it gave.
picked_ports=" "
pick_port() { # VAR
	local _p _lo
	_lo=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range)
	while :; do
		_p=$((10000 + RANDOM % (_lo - 10000)))
		case "$picked_ports" in *" $_p "*) continue ;; esac
		if ! ss -Htan "sport = :$_p" | grep -q .; then
			picked_ports="$picked_ports$_p "
			printf -v "$1" %s "$_p"
			return
		fi
	done
}
