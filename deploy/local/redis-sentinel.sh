#!/usr/bin/env bash
# A Redis master, one replica and three sentinels on this machine, for tests
# and trying delayd's sentinel mode: Debian's redis-server, state under DIR.
#
#   deploy/local/redis-sentinel.sh start DIR BASEPORT [WATCH_PID]
#   deploy/local/redis-sentinel.sh stop DIR
#   deploy/local/redis-sentinel.sh kill-node DIR PORT   (SIGKILL, as a crash)
#   deploy/local/redis-sentinel.sh heal DIR             (restart downed nodes)
#
# The master listens on BASEPORT, the replica on BASEPORT+1, the sentinels on
# BASEPORT+2..BASEPORT+4; they monitor the master as "main" with quorum 2 and
# down-after-milliseconds 1000, 1400 and 1800: staggered, so that the
# sentinel that finds the master down second starts the failover try and
# the others vote for it. With one value for all three they could start
# their tries in the same moment and each vote for itself (a split vote:
# no leader, the next try 2 x failover-timeout later; seen once, the
# failover then came 22 s after the kill). `start` returns once the replica is in sync
# and every sentinel knows the replica and the other sentinels. With
# WATCH_PID, a watcher stops everything when that process exits.
#
# `heal` restarts every data node that is down as a replica of the master the
# sentinels name (a killed master must not come back as an empty master) and
# returns once the set is ready again, whichever node is now the master.
#
# With DELAYD_REDIS_PASSWORD at `start`, the data nodes require it (and the
# sentinels use it); with DELAYD_SENTINEL_PASSWORD, the sentinels require
# theirs. Both are kept in DIR (mode 600) for the later commands.
set -euo pipefail

LOG_TAG=redis-sentinel
# shellcheck source=deploy/local/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# shellcheck source=deploy/local/redis-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/redis-lib.sh"


# Passwords reach redis-cli through its environment, never its arguments.
data_pass() { cat "$DIR/redis.pass" 2>/dev/null || true; }
sentinel_pass() { cat "$DIR/sentinel.pass" 2>/dev/null || true; }
authed_cli() { # PASSWORD PORT ARGS...
	local pass="$1"
	shift
	if [[ -n "$pass" ]]; then
		REDISCLI_AUTH="$pass" timeout 5 redis-cli -h 127.0.0.1 -p "$1" "${@:2}"
	else
		timeout 5 redis-cli -h 127.0.0.1 -p "$1" "${@:2}"
	fi
}
dcli() { authed_cli "$(data_pass)" "$@"; }
scli() { authed_cli "$(sentinel_pass)" "$@"; }

# conf_quote VALUE: VALUE as a double-quoted redis.conf string.
conf_quote() {
	local v="${1//\\/\\\\}"
	printf '"%s"' "${v//\"/\\\"}"
}

spawn() { # PORT ARGS...: a redis-server in the background, pid in DIR/PORT.pid
	local port="$1"
	shift
	mkdir -p "$DIR/$port"
	DELAYD_TEST_REDIS_NODE=1 setsid redis-server "$@" </dev/null >/dev/null 2>&1 &
	printf '%s\n' "$!" >"$DIR/$port.pid"
}

data_node() { # PORT [MASTERPORT]
	local port="$1" pass
	mkdir -p "$DIR/$port"
	pass="$(data_pass)"
	# A file, so the password stays out of the process list.
	{
		printf 'port %s\nbind 127.0.0.1\ndir %s\n' "$port" "$DIR/$port"
		printf 'appendonly no\nsave ""\nrepl-diskless-sync-delay 0\n'
		printf 'notify-keyspace-events Kz\ndaemonize no\nlogfile %s\n' "$DIR/$port/redis.log"
		if [[ -n "${2:-}" ]]; then printf 'replicaof 127.0.0.1 %s\n' "$2"; fi
		if [[ -n "$pass" ]]; then printf 'requirepass %s\nmasterauth %s\n' "$(conf_quote "$pass")" "$(conf_quote "$pass")"; fi
	} >"$DIR/$port/redis.conf"
	chmod 600 "$DIR/$port/redis.conf"
	spawn "$port" "$DIR/$port/redis.conf"
}

sentinel_node() { # PORT MASTERPORT
	local port="$1" master="$2" pass spass
	mkdir -p "$DIR/$port"
	pass="$(data_pass)" spass="$(sentinel_pass)"
	# Sentinel rewrites its config file with what it learns: one per sentinel.
	{
		printf 'port %s\nbind 127.0.0.1\ndir %s\nlogfile %s\n' "$port" "$DIR/$port" "$DIR/$port/sentinel.log"
		printf 'sentinel monitor main 127.0.0.1 %s 2\n' "$master"
		printf 'sentinel down-after-milliseconds main %s\n' "$((1000 + (port - master - 2) * 400))"
		printf 'sentinel failover-timeout main %s\n' "$FAILOVER_TIMEOUT_MS"
		printf 'sentinel parallel-syncs main 1\n'
		if [[ -n "$pass" ]]; then printf 'sentinel auth-pass main %s\n' "$(conf_quote "$pass")"; fi
		# Sentinels ask each other for votes with the password they require.
		if [[ -n "$spass" ]]; then
			printf 'requirepass %s\nsentinel sentinel-pass %s\n' "$(conf_quote "$spass")" "$(conf_quote "$spass")"
		fi
	} >"$DIR/$port/sentinel.conf"
	chmod 600 "$DIR/$port/sentinel.conf"
	spawn "$port" "$DIR/$port/sentinel.conf" --sentinel
}

answers() { [[ "$(dcli "$1" ping 2>/dev/null)" == "PONG" ]]; }

# A sentinel that tried a failover, or voted for another's, starts none of
# its own for twice failover-timeout; a successful one (+switch-master)
# clears that. Right after a switch, a loaded machine can make the new
# master miss a ping, and the attempt that follows (aborted: no replica
# yet) would hold the next real failover back for 20 s.
FAILOVER_TIMEOUT_MS=10000

# failover_free: no sentinel is inside that window since its last switch.
failover_free() {
	local base p last t now
	base="$(cat "$DIR/base")"
	now="$(now_ms)"
	for p in $((base + 2)) $((base + 3)) $((base + 4)); do
		[[ -f "$DIR/$p/sentinel.log" ]] || continue
		last="$(awk '/\+switch-master/ { n = 0; next } /\+try-failover|\+vote-for-leader/ { n = 1; l = $2 " " $3 " " $4 " " $5 } END { if (n) print l }' "$DIR/$p/sentinel.log")"
		[[ -n "$last" ]] || continue
		t="$(date -d "$last" +%s%3N)" || return 1
		((now - t > 2 * FAILOVER_TIMEOUT_MS + 1000)) || return 1
	done
}

# field NAME: the value after the line NAME in a field/value reply on stdin.
field() { grep -A1 -x "$1" | sed -n 2p; }

# The master's port as the sentinels name it; fails unless they all agree.
named_master() {
	local base p reply port="" m
	base="$(cat "$DIR/base")"
	for p in $((base + 2)) $((base + 3)) $((base + 4)); do
		reply="$(scli "$p" sentinel get-master-addr-by-name main)" || return 1
		m="$(sed -n 2p <<<"$reply")"
		[[ "$m" =~ ^[0-9]+$ ]] || return 1
		[[ -z "$port" || "$port" == "$m" ]] || return 1
		port="$m"
	done
	printf '%s\n' "$port"
}

# Ready: the sentinels agree on a master that says it is one, the other data
# node replicates it with its link up, every sentinel sees that replica
# healthy and the two other sentinels, and each could fail over now.
ready() {
	local base master replica p info
	base="$(cat "$DIR/base")"
	failover_free || return 1
	master="$(named_master)" || return 1
	if ((master == base)); then replica=$((base + 1)); else replica=$base; fi
	[[ "$(dcli "$master" role | head -1)" == "master" ]] || return 1
	info="$(dcli "$replica" info replication)" || return 1
	[[ "$info" == *"master_port:$master"* && "$info" == *"master_link_status:up"* ]] || return 1
	for p in $((base + 2)) $((base + 3)) $((base + 4)); do
		info="$(scli "$p" sentinel master main)" || return 1
		[[ "$(field num-slaves <<<"$info")" == 1 ]] || return 1
		[[ "$(field num-other-sentinels <<<"$info")" == 2 ]] || return 1
		info="$(scli "$p" sentinel replicas main)" || return 1
		[[ "$(field flags <<<"$info")" == "slave" ]] || return 1
	done
}

case "${1:-}" in
start)
	(($# >= 3)) || usage
	base="$3" watch="${4:-}"
	valid_port "$base" BASEPORT
	valid_port $((base + 4)) "BASEPORT+4"
	ensure_redis
	mkdir -p "$2"
	DIR="$(cd "$2" && pwd -P)"
	printf '%s\n' "$base" >"$DIR/base"
	(
		umask 077
		printf '%s' "${DELAYD_REDIS_PASSWORD:-}" >"$DIR/redis.pass"
		printf '%s' "${DELAYD_SENTINEL_PASSWORD:-}" >"$DIR/sentinel.pass"
	)
	t0="$(now_ms)"
	data_node "$base"
	wait_until 20 "master answering" answers "$base"
	data_node $((base + 1)) "$base"
	for p in $((base + 2)) $((base + 3)) $((base + 4)); do
		sentinel_node "$p" "$base"
	done
	wait_until 30 "replica in sync and sentinels agreed" ready
	[[ -z "$watch" ]] || watch_pidfiles "$watch" "$DIR"
	log "master 127.0.0.1:$base, replica :$((base + 1)), sentinels :$((base + 2))-$((base + 4)) ready in $(($(now_ms) - t0)) ms"
	;;
stop | kill-node)
	stop_or_kill_node "$@"
	;;
heal)
	(($# == 2)) || usage
	DIR="$(cd "$2" && pwd -P)"
	base="$(cat "$DIR/base")"
	t0="$(now_ms)"
	for p in "$base" $((base + 1)); do
		alive "$(read_pid "$DIR/$p.pid")" && continue
		wait_until 30 "a master named by every sentinel" named_master
		master="$(named_master)"
		((master != p)) || die "the sentinels name $p master, but it is down"
		data_node "$p" "$master"
		log "restarted :$p as a replica of :$master"
	done
	wait_until 30 "replica in sync and sentinels agreed" ready
	log "ready (master :$(named_master)) in $(($(now_ms) - t0)) ms"
	;;
*) usage ;;
esac
