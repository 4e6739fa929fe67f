#!/usr/bin/env bash
# A private RabbitMQ cluster on this machine, for tests that kill and stop
# nodes: each node is a deploy/local/rabbitmq-node.sh node (its state in
# DIR/node-<AMQP_PORT>, name delayd-test-<AMQP_PORT>@localhost), all sharing
# one Erlang cookie; the first is the seed the others join.
#
#   deploy/local/rabbitmq-cluster.sh start DIR AMQP_PORT...   start the nodes in parallel, cluster them
#   deploy/local/rabbitmq-cluster.sh stop  DIR AMQP_PORT...   graceful stop of every node
#
# Each node's Erlang distribution port is its AMQP port - 10000. `start`
# prints one AMQP URL per node on stdout. With DELAYD_RABBITMQ_WATCH_PID set,
# every node is killed once that process has exited. A single node is then
# managed with rabbitmq-node.sh on DIR/node-<AMQP_PORT> (with
# DELAYD_RABBITMQ_DIST_PORT and DELAYD_RABBITMQ_COOKIE=$(cat DIR/cookie) when
# restarting it).
set -euo pipefail

LOG_TAG=rabbitmq-cluster
# shellcheck source=deploy/local/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# shellcheck source=deploy/local/rabbitmq-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/rabbitmq-lib.sh"
NODE_SCRIPT="$(dirname "${BASH_SOURCE[0]}")/rabbitmq-node.sh"


(($# >= 3)) || usage
cmd="$1"
dir="$2"
shift 2
ports=("$@")
for p in "${ports[@]}"; do
	valid_port "$p" AMQP_PORT
	((p > 10000)) || die "AMQP port $p: the distribution port (AMQP port - 10000) would not be valid"
done
mkdir -p "$dir"
dir="$(cd "$dir" && pwd -P)"

case "$cmd" in
start)
	ensure_packages
	if [[ ! -s "$dir/cookie" ]]; then
		(
			umask 077
			head -c 48 /dev/urandom | od -An -tx1 | tr -d ' \n' | tr '0-9a-f' 'A-P' >"$dir/cookie"
		)
	fi
	export DELAYD_RABBITMQ_COOKIE
	DELAYD_RABBITMQ_COOKIE="$(cat "$dir/cookie")"
	# epmd first, once: parallel starts would otherwise race to launch it.
	ensure_epmd
	t0="$(now_ms)"
	pids=()
	for p in "${ports[@]}"; do
		DELAYD_RABBITMQ_DIST_PORT=$((p - 10000)) "$NODE_SCRIPT" start "$dir/node-$p" "$p" >/dev/null &
		pids+=($!)
	done
	failed=0
	for pid in "${pids[@]}"; do
		wait "$pid" || failed=1
	done
	((failed == 0)) || die "a node did not start (logs above)"
	seed="delayd-test-${ports[0]}@localhost"
	# Each node joins the seed; a node that is already a member (a restart of
	# the script on the same DIR) is left as it is. One at a time: two nodes
	# joining the same seed at once can fail to start Mnesia on RabbitMQ 3.x,
	# and a node whose join failed is reset and tries once more.
	join_once() {
		local p="$1" node="delayd-test-$1@localhost" ndir="$dir/node-$1"
		rmq_ctl "$ndir" "$node" "$p" $((p - 10000)) -q stop_app &&
			rmq_ctl "$ndir" "$node" "$p" $((p - 10000)) -q reset &&
			rmq_ctl "$ndir" "$node" "$p" $((p - 10000)) -q join_cluster "$seed" &&
			rmq_ctl "$ndir" "$node" "$p" $((p - 10000)) -q start_app &&
			rmq_ctl "$ndir" "$node" "$p" $((p - 10000)) -q await_startup --timeout "$DELAYD_START_TIMEOUT"
	}
	join() {
		local p="$1" node="delayd-test-$1@localhost" ndir="$dir/node-$1"
		if grep -q "$seed" <<<"$(rmq_ctl "$ndir" "$node" "$p" $((p - 10000)) -q cluster_status 2>/dev/null || true)"; then
			return 0
		fi
		join_once "$p" && return 0
		# A failed start_app can leave Mnesia running, which a second reset
		# refuses: restart the whole node before the one retry.
		log "node $p could not join $seed; restarting it and trying once more"
		DELAYD_RABBITMQ_DIST_PORT=$((p - 10000)) "$NODE_SCRIPT" stop "$ndir" "$p" >/dev/null || true
		DELAYD_RABBITMQ_DIST_PORT=$((p - 10000)) "$NODE_SCRIPT" start "$ndir" "$p" >/dev/null &&
			join_once "$p"
	}
	for p in "${ports[@]:1}"; do
		join "$p" || die "a node could not join $seed (state in $dir)"
	done
	log "cluster of ${#ports[@]} nodes ready ($(($(now_ms) - t0)) ms): ${ports[*]}"
	for p in "${ports[@]}"; do
		printf 'amqp://guest:guest@127.0.0.1:%s/%%2f\n' "$p"
	done
	;;
stop)
	pids=()
	for p in "${ports[@]}"; do
		DELAYD_RABBITMQ_DIST_PORT=$((p - 10000)) "$NODE_SCRIPT" stop "$dir/node-$p" "$p" &
		pids+=($!)
	done
	for pid in "${pids[@]}"; do
		wait "$pid" || true
	done
	;;
*) usage ;;
esac
