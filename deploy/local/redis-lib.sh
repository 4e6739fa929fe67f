# shellcheck shell=bash
# Private Redis server helpers for the deploy/local scripts (cluster, sentinel
# and TLS test servers). Sourced after lib.sh, never executed.

# redis-cluster.sh and redis-sentinel.sh keep each server's state under
# DIR/PORT and its pid in DIR/PORT.pid.

# ensure_redis: redis-server and redis-cli, installed when missing.
ensure_redis() {
	if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
		ensure_packages
	fi
}

# redis_cli PORT ARGS...: redis-cli against 127.0.0.1:PORT, never longer than 5s.
redis_cli() { timeout 5 redis-cli -h 127.0.0.1 -p "$1" "${@:2}"; }

# kill_pidfiles DIR: SIGKILL every server with a pid file in DIR.
kill_pidfiles() {
	local f pid
	for f in "$1"/*.pid; do
		[[ -e "$f" ]] || continue
		pid="$(read_pid "$f")"
		if [[ -n "$pid" ]]; then
			kill -KILL "$pid" 2>/dev/null || true
		fi
		rm -f "$f"
	done
}

# kill_pidfile DIR PORT: SIGKILL the server on PORT, as a crash.
kill_pidfile() {
	local pid
	pid="$(read_pid "$1/$2.pid")"
	[[ -n "$pid" ]] || die "no node on port $2 in $1"
	kill -KILL "$pid"
	rm -f "$1/$2.pid"
}

# stop_or_kill_node stop DIR | kill-node DIR PORT: the two commands every
# multi-node script takes alike (each script has its own usage).
stop_or_kill_node() {
	case "$1" in
	stop)
		(($# == 2)) || usage
		kill_pidfiles "$2"
		;;
	kill-node)
		(($# == 3)) || usage
		kill_pidfile "$2" "$3"
		;;
	esac
}

# watch_pidfiles PID DIR: a detached watcher that kills DIR's servers once
# process PID has exited (a test binary has no global teardown, so it passes
# its own pid). It outlives the caller and ends with the servers.
watch_pidfiles() {
	# shellcheck disable=SC2016 # expanded by the inner bash
	setsid bash -c '
		while kill -0 "$1" 2>/dev/null; do sleep 0.5; done
		for f in "$2"/*.pid; do [[ -e "$f" ]] && kill -KILL "$(cat "$f")" 2>/dev/null; rm -f "$f"; done
	' _ "$1" "$2" </dev/null >/dev/null 2>&1 &
}

# redis_test_node_pids: pids of running private test Redis servers (cluster
# and sentinel nodes from redis-cluster.sh / redis-sentinel.sh, the TLS
# tests' servers), recognised by the DELAYD_TEST_REDIS_NODE marker in their
# environment.
redis_test_node_pids() {
	local pid
	for pid in $(pgrep -x redis-server || true) $(pgrep -x redis-sentinel || true) $(pgrep -x valkey-server || true); do
		if env_has "$pid" '^DELAYD_TEST_REDIS_NODE=1'; then
			printf '%s\n' "$pid"
		fi
	done
}
