#!/usr/bin/env bash
# A separate, private RabbitMQ node for fault tests, which stop, kill and
# restart the broker mid-flow without disturbing the shared one from
# servers.sh.
#
#   deploy/local/rabbitmq-node.sh start  DIR AMQP_PORT   start; block until it accepts AMQP (60s)
#   deploy/local/rabbitmq-node.sh stop   DIR AMQP_PORT   graceful stop; wait until the port is closed
#   deploy/local/rabbitmq-node.sh kill   DIR AMQP_PORT   SIGKILL the Erlang VM (a crash)
#   deploy/local/rabbitmq-node.sh status DIR AMQP_PORT   exit 0 if it answers AMQP
#   deploy/local/rabbitmq-node.sh ctl    DIR AMQP_PORT ARGS...  rabbitmqctl ARGS against the node
#
# All of the node's state (database, logs, cookie, config) lives in DIR, so
# it can be restarted on the same DIR and port and keeps its durable queues
# and persistent messages. `start` prints the node's AMQP URL on stdout;
# everything else goes to stderr.
#
# Node name: delayd-test-<AMQP_PORT>@localhost. Erlang distribution port:
# AMQP_PORT+10000 (AMQP_PORT-10000 above 55535), or DELAYD_RABBITMQ_DIST_PORT.
# Timeout: DELAYD_START_TIMEOUT seconds (default 60).
#
# Optional, for `start`:
#   DELAYD_RABBITMQ_TLS_PORT, DELAYD_RABBITMQ_TLS_CERTS  an SSL listener on that
#       port with the certificates of deploy/local/certs.sh in that directory
#       (client certificates required; EXTERNAL login as user "delayd")
#   DELAYD_RABBITMQ_COOKIE     the Erlang cookie (the same for a cluster's nodes)
#   DELAYD_RABBITMQ_WATCH_PID  kill the node once this process has exited
#   DELAYD_RABBITMQ_DELAYED_PLUGIN=1  run the archived delayed-message plugin
#       (compiled once from deploy/local/vendor for the set's broker), for
#       `delayd adopt` tests
set -euo pipefail

LOG_TAG=rabbitmq-node
# shellcheck source=deploy/local/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# shellcheck source=deploy/local/rabbitmq-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/rabbitmq-lib.sh"


(($# >= 3)) || usage
cmd="$1"
dir="$2"
port="$3"
shift 3
[[ "$cmd" == ctl || $# -eq 0 ]] || usage
[[ -n "$dir" ]] || usage
valid_port "$port" AMQP_PORT
dist="$(dist_port "$port" 10000)"
node="delayd-test-${port}@localhost"

# Absolute, symlink-free path: it is compared with the VM's environment to
# recognise the node's own process.
case "$cmd" in
start)
	mkdir -p "$dir"
	dir="$(cd "$dir" && pwd -P)"
	ensure_packages
	rmq_start "$dir" "$node" "$port" "$dist"
	if [[ -n "${DELAYD_RABBITMQ_WATCH_PID:-}" ]]; then
		rmq_watch "$dir" "$node" "$port" "$DELAYD_RABBITMQ_WATCH_PID"
	fi
	printf 'amqp://guest:guest@127.0.0.1:%s/%%2f\n' "$port"
	;;
ctl)
	dir="$(cd "$dir" && pwd -P)"
	rmq_ctl "$dir" "$node" "$port" "$dist" "$@"
	;;
stop | kill | status)
	if [[ -d "$dir" ]]; then
		dir="$(cd "$dir" && pwd -P)"
	fi
	case "$cmd" in
	stop) rmq_stop "$dir" "$node" "$port" ;;
	kill) rmq_kill "$dir" "$node" "$port" ;;
	status)
		if amqp_answers "$port" && pid="$(rmq_vm_pid "$dir")"; then
			echo "running: node $node, pid $pid, amqp 127.0.0.1:$port, state in $dir"
		else
			echo "not running: node $node (port $port)"
			exit 3
		fi
		;;
	esac
	;;
*) usage ;;
esac
