#!/usr/bin/env bash
# A Redis master, one replica and three sentinels on this machine, for tests
# and trying delayd's sentinel mode: Debian's redis-server, state under DIR.
#
#   deploy/local/redis-sentinel.sh start DIR BASEPORT [WATCH_PID]
#   deploy/local/redis-sentinel.sh stop DIR
#   deploy/local/redis-sentinel.sh kill-node DIR PORT   (SIGKILL, as a crash)
#
# The master listens on BASEPORT, the replica on BASEPORT+1, the sentinels on
# BASEPORT+2..BASEPORT+4; they monitor the master as "main" with quorum 2 and
# down-after-milliseconds 1000. `start` returns once the replica is in sync
# and every sentinel knows the replica and the other sentinels. With
# WATCH_PID, a watcher stops everything when that process exits.
set -euo pipefail

LOG_TAG=redis-sentinel
# shellcheck source=deploy/local/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() {
	sed -n '5,7p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
	exit 2
}

cli() { timeout 5 redis-cli -h 127.0.0.1 -p "$1" "${@:2}"; }

spawn() { # DIR PORT ARGS...: a redis-server in the background, pid in DIR/PORT.pid
	local dir="$1" port="$2"
	shift 2
	mkdir -p "$dir/$port"
	DELAYD_TEST_REDIS_NODE=1 setsid redis-server "$@" </dev/null >/dev/null 2>&1 &
	printf '%s\n' "$!" >"$dir/$port.pid"
}

data_node() { # DIR PORT [MASTERPORT]
	local dir="$1" port="$2" args=()
	[[ -n "${3:-}" ]] && args=(--replicaof 127.0.0.1 "$3")
	spawn "$dir" "$port" --port "$port" --bind 127.0.0.1 --dir "$dir/$port" \
		--appendonly no --save '' --repl-diskless-sync-delay 0 \
		--notify-keyspace-events Kz --daemonize no \
		--logfile "$dir/$port/redis.log" "${args[@]}"
}

sentinel_node() { # DIR PORT MASTERPORT
	local dir="$1" port="$2" master="$3"
	mkdir -p "$dir/$port"
	# Sentinel rewrites its config file with what it learns: one per sentinel.
	cat >"$dir/$port/sentinel.conf" <<-EOF
		port $port
		bind 127.0.0.1
		dir $dir/$port
		logfile $dir/$port/sentinel.log
		sentinel monitor main 127.0.0.1 $master 2
		sentinel down-after-milliseconds main 1000
		sentinel failover-timeout main 10000
		sentinel parallel-syncs main 1
	EOF
	spawn "$dir" "$port" "$dir/$port/sentinel.conf" --sentinel
}

wait_until() { # SECONDS DESCRIPTION COMMAND...
	local limit="$1" what="$2" t0
	shift 2
	t0="$(now_ms)"
	until "$@" >/dev/null 2>&1; do
		if (($(now_ms) - t0 > limit * 1000)); then
			die "$what not reached within ${limit}s"
		fi
		sleep 0.05
	done
}

ready() { # BASEPORT
	local base="$1" p info
	info="$(cli $((base + 1)) info replication)" || return 1
	[[ "$info" == *"master_link_status:up"* ]] || return 1
	for p in $((base + 2)) $((base + 3)) $((base + 4)); do
		info="$(cli "$p" sentinel master main)" || return 1
		# num-slaves 1 and num-other-sentinels 2, as the reply's field/value lines.
		grep -A1 -x 'num-slaves' <<<"$info" | tail -1 | grep -qx 1 || return 1
		grep -A1 -x 'num-other-sentinels' <<<"$info" | tail -1 | grep -qx 2 || return 1
	done
}

stop_all() { # DIR
	local f pid
	for f in "$1"/*.pid; do
		[[ -e "$f" ]] || continue
		pid="$(read_pid "$f")"
		[[ -n "$pid" ]] && kill -KILL "$pid" 2>/dev/null || true
		rm -f "$f"
	done
}

case "${1:-}" in
start)
	(($# >= 3)) || usage
	dir="$2" base="$3" watch="${4:-}"
	valid_port "$base" BASEPORT
	valid_port $((base + 4)) "BASEPORT+4"
	command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1 || ensure_packages
	mkdir -p "$dir"
	dir="$(cd "$dir" && pwd -P)"
	t0="$(now_ms)"
	data_node "$dir" "$base"
	wait_until 20 "master answering" redis_answers "$base"
	data_node "$dir" $((base + 1)) "$base"
	for p in $((base + 2)) $((base + 3)) $((base + 4)); do
		sentinel_node "$dir" "$p" "$base"
	done
	wait_until 30 "replica in sync and sentinels agreed" ready "$base"
	if [[ -n "$watch" ]]; then
		setsid bash -c '
			while kill -0 "$1" 2>/dev/null; do sleep 0.5; done
			for f in "$2"/*.pid; do [[ -e "$f" ]] && kill -KILL "$(cat "$f")" 2>/dev/null; rm -f "$f"; done
		' _ "$watch" "$dir" </dev/null >/dev/null 2>&1 &
	fi
	log "master 127.0.0.1:$base, replica :$((base + 1)), sentinels :$((base + 2))-$((base + 4)) ready in $(($(now_ms) - t0)) ms"
	;;
stop)
	(($# == 2)) || usage
	stop_all "$2"
	;;
kill-node)
	(($# == 3)) || usage
	pid="$(read_pid "$2/$3.pid")"
	[[ -n "$pid" ]] || die "no node on port $3 in $2"
	kill -KILL "$pid"
	rm -f "$2/$3.pid"
	;;
*) usage ;;
esac
