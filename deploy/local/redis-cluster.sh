#!/usr/bin/env bash
# A Redis Cluster of 3 masters and 3 replicas on this machine, for tests and
# trying delayd's cluster mode: Debian's redis-server, one process per node,
# state under DIR.
#
#   deploy/local/redis-cluster.sh start DIR PORTS [WATCH_PID]
#   deploy/local/redis-cluster.sh stop DIR
#   deploy/local/redis-cluster.sh kill-node DIR PORT    (SIGKILL, as a crash)
#   deploy/local/redis-cluster.sh start-node DIR PORT   (again, same state)
#   deploy/local/redis-cluster.sh wait DIR              (until ready again)
#
# PORTS is BASEPORT (nodes on BASEPORT..BASEPORT+5) or six comma-separated
# ports; each node's cluster bus listens on its port + 10000, or on the
# matching port of DELAYD_CLUSTER_BUS_PORTS (six, comma-separated) when set,
# as tests set it: a machine's ephemeral ports can hold any one of them.
# Nodes run with --cluster-node-timeout 2000 and keyspace notifications
# (Kz) on. `start`
# returns once every slot is served, every node agrees the cluster is ok,
# sees 3 masters with a replica each and none failing, and every replica is
# in sync, and prints nothing else. With WATCH_PID, a
# watcher stops the nodes when that process exits: a test binary has no
# global teardown, so it passes its own pid.
set -euo pipefail

LOG_TAG=redis-cluster
# shellcheck source=deploy/local/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# shellcheck source=deploy/local/redis-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/redis-lib.sh"


# start_node DIR PORT [BUSPORT]: one cluster node in the background, pid in
# DIR/PORT.pid; the bus port is remembered in DIR/PORT.bus for restarts.
start_node() {
	local dir="$1" port="$2" bus="${3:-}"
	mkdir -p "$dir/$port"
	if [[ -z "$bus" ]]; then
		bus="$(cat "$dir/$port.bus" 2>/dev/null || echo $((port + 10000)))"
	fi
	printf '%s\n' "$bus" >"$dir/$port.bus"
	# The marker lets deploy/local/test.sh find leftovers of a failed run.
	DELAYD_TEST_REDIS_NODE=1 setsid redis-server \
		--port "$port" --bind 127.0.0.1 --dir "$dir/$port" \
		--cluster-enabled yes --cluster-config-file "$dir/$port/nodes.conf" \
		--cluster-port "$bus" \
		--cluster-node-timeout 2000 \
		--appendonly no --save '' --repl-diskless-sync-delay 0 \
		--notify-keyspace-events Kz --daemonize no \
		--logfile "$dir/$port/redis.log" </dev/null >/dev/null 2>&1 &
	printf '%s\n' "$!" >"$dir/$port.pid"
}

# pairs_seen NODES: true when a CLUSTER NODES answer shows no node failing
# (fail or fail?) and 3 masters each with one replica. Each node's own state
# is ok at once after a failover while other nodes still show the old pairs
# (the old master as a master without slots), and tests read the pairs from
# one node's view.
pairs_seen() {
	awk '
		$3 ~ /fail/ { bad = 1 }
		$3 ~ /master/ { masters[$1] = 1 }
		$3 ~ /slave/ { replicas[$4]++ }
		END {
			n = 0
			for (m in masters) { n++; if (replicas[m] != 1) bad = 1 }
			for (r in replicas) if (!(r in masters)) bad = 1
			exit (bad || n != 3)
		}' <<<"$1"
}

cluster_ready() { # PORT...
	local p info
	for p in "$@"; do
		info="$(redis_cli "$p" cluster info)" || return 1
		[[ "$info" == *"cluster_state:ok"* && "$info" == *"cluster_slots_ok:16384"* && "$info" == *"cluster_known_nodes:6"* ]] || return 1
		info="$(redis_cli "$p" cluster nodes)" || return 1
		pairs_seen "$info" || return 1
		info="$(redis_cli "$p" info replication)" || return 1
		if [[ "$info" == *"role:slave"* ]]; then
			[[ "$info" == *"master_link_status:up"* ]] || return 1
		else
			[[ "$info" == *"connected_slaves:1"* ]] || return 1
		fi
	done
}

cmd="${1:-}"
case "$cmd" in
start)
	(($# >= 3)) || usage
	dir="$2" watch="${4:-}"
	if [[ "$3" == *,* ]]; then
		IFS=, read -r -a ports <<<"$3"
	else
		valid_port "$3" BASEPORT
		mapfile -t ports < <(seq "$3" $(($3 + 5)))
	fi
	buses=()
	[[ -n "${DELAYD_CLUSTER_BUS_PORTS:-}" ]] && IFS=, read -r -a buses <<<"$DELAYD_CLUSTER_BUS_PORTS"
	((${#ports[@]} == 6)) || die "PORTS must name six ports (got $3)"
	for i in "${!ports[@]}"; do
		valid_port "${ports[$i]}" "port"
		[[ -n "${buses[$i]:-}" ]] || buses[i]=$((ports[i] + 10000))
		valid_port "${buses[$i]}" "cluster bus port"
	done
	ensure_redis
	mkdir -p "$dir"
	dir="$(cd "$dir" && pwd -P)"
	printf '%s\n' "${ports[@]}" >"$dir/ports"
	t0="$(now_ms)"
	nodes=()
	for i in "${!ports[@]}"; do
		start_node "$dir" "${ports[$i]}" "${buses[$i]}"
		nodes+=("127.0.0.1:${ports[$i]}")
	done
	for p in "${ports[@]}"; do
		wait_until 20 "node $p answering" redis_answers "$p"
	done
	timeout 30 redis-cli --cluster create "${nodes[@]}" --cluster-replicas 1 --cluster-yes >"$dir/create.log" 2>&1 ||
		die "redis-cli --cluster create failed: $(tail -5 "$dir/create.log")"
	wait_until 30 "cluster ok on every node with replicas in sync" cluster_ready "${ports[@]}"
	[[ -z "$watch" ]] || watch_pidfiles "$watch" "$dir"
	log "cluster on 127.0.0.1:$(
		IFS=,
		echo "${ports[*]}"
	) ready in $(($(now_ms) - t0)) ms"
	;;
stop | kill-node)
	stop_or_kill_node "$@"
	;;
start-node)
	(($# == 3)) || usage
	dir="$(cd "$2" && pwd -P)"
	start_node "$dir" "$3"
	wait_until 20 "node $3 answering" redis_answers "$3"
	;;
wait)
	(($# == 2)) || usage
	mapfile -t ports <"$2/ports"
	wait_until 30 "cluster ok on every node with replicas in sync" cluster_ready "${ports[@]}"
	;;
*) usage ;;
esac
