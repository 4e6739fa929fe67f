#!/usr/bin/env bash
# Runs test binaries against one server set (deploy/local/lib.sh), with the
# test build that deploy/local/test.sh made: the matrix's further sets.
#
#   deploy/local/test-set.sh SET [cargo test args]   e.g. rabbitmq4-valkey8 --test intake
#
# Starts the set's Redis and RabbitMQ (servers.sh start, on the set's ports or
# DELAYD_REDIS_PORT / DELAYD_AMQP_PORT), runs the test build (CARGO_TEST in
# lib.sh) with --no-fail-fast ARGS in the set's environment (servers.sh env:
# its URLs, and its commands first on PATH for the servers tests start
# themselves), and stops the servers it started. On a RabbitMQ 4 set it then runs the tests
# that need RabbitMQ 4 and are ignored elsewhere (tests/intake_amqp10.rs).
# Exits non-zero if any cargo run failed.
set -euo pipefail

(($# >= 1)) || {
	grep -E '^#   deploy/local/test-set\.sh ' "$0" | sed 's/^#   //' >&2
	exit 2
}
export DELAYD_SERVERS="$1"
shift

LOG_TAG="test $DELAYD_SERVERS"
# shellcheck source=deploy/local/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$DELAYD_REPO_ROOT"

note_servers_to_stop
exit_trap stop_noted_servers
start_servers
log "DELAYD_TEST_REDIS_URL=$DELAYD_TEST_REDIS_URL DELAYD_TEST_AMQP_URL=$DELAYD_TEST_AMQP_URL"
rc=0
"${CARGO_TEST[@]}" --no-fail-fast "$@" || rc=$?
if [[ "$SET_RABBITMQ" == 4 ]]; then
	"${CARGO_TEST[@]}" --test intake_amqp10 -- --include-ignored || rc=$?
fi
exit "$rc"
