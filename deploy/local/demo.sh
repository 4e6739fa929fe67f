#!/usr/bin/env bash
# THE "run it for real" command: delayd between a local Redis and RabbitMQ.
#
#   deploy/local/demo.sh
#
# Starts the servers, builds delayd, declares the demo exchanges and queues,
# runs `delayd run` in the background, schedules ten members over ~5 s for two
# businesses, shows each delivery as a consumer receives it (with its lateness:
# receipt time minus x-delayd-due), shows `delayd inspect`, then stops delayd
# with SIGTERM and reports its exit code (0 = clean stop).
#
# The config file (default config/delayd.toml) must define the two businesses
#   order_timeout -> exchange "orders",    routing key "order.timeout"
#   reminder      -> exchange "reminders", routing key "reminder.due"
# Its Redis and AMQP URLs are overridden to point at the local servers.
#
# Environment:
#   DELAYD_DEMO_CONFIG             config file (default config/delayd.toml)
#   DELAYD_DEMO_ORDER_BUSINESS     business name (default order_timeout)
#   DELAYD_DEMO_REMINDER_BUSINESS  business name (default reminder)
#   DELAYD_BIN                     use this delayd binary instead of building one
#   DELAYD_KEEP_SERVERS=1          leave the servers running at the end
# The consumer is deploy/local/consume.py, run with pika from a virtualenv in
# .local/venv (created on first use).
set -euo pipefail

LOG_TAG=demo
# shellcheck source=deploy/local/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
CONFIG="${DELAYD_DEMO_CONFIG:-config/delayd.toml}"
ORDER="${DELAYD_DEMO_ORDER_BUSINESS:-order_timeout}"
REMINDER="${DELAYD_DEMO_REMINDER_BUSINESS:-reminder}"
DEMO_DIR="$DELAYD_LOCAL_DIR/demo"
DELAYD_LOG="$DEMO_DIR/delayd.log"
MESSAGES=10

# Bold headings on a terminal, plain text in a log.
if [[ -t 1 ]]; then
	banner() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
else
	banner() { printf '\n== %s\n' "$*"; }
fi

cd "$DELAYD_REPO_ROOT"
[[ -f "$CONFIG" ]] || die "config file $CONFIG not found (set DELAYD_DEMO_CONFIG)"
mkdir -p "$DEMO_DIR"

# --- servers (stop at exit only those this script started) ---------------------
note_servers_to_stop
delayd_pid=""
consumer_pid=""
cleanup() {
	local rc=$? s
	# Interrupted half-way: do not leave delayd or the consumer behind.
	for s in "$delayd_pid" "$consumer_pid"; do
		if [[ -n "$s" ]] && alive "$s"; then
			kill -TERM "$s" 2>/dev/null || true
			wait "$s" 2>/dev/null || true
		fi
	done
	stop_noted_servers
	exit "$rc"
}
exit_trap cleanup

banner "starting Redis and RabbitMQ (deploy/local/servers.sh start)"
start_servers
# The contract's environment overrides: whatever URLs the file holds, use ours.
export DELAYD_REDIS__URL="$DELAYD_TEST_REDIS_URL"
export DELAYD_AMQP__URL="$DELAYD_TEST_AMQP_URL"

# --- build ---------------------------------------------------------------------
if [[ -n "${DELAYD_BIN:-}" ]]; then
	BIN="$DELAYD_BIN"
else
	banner "building delayd (cargo build --release)"
	cargo build --release
	BIN="$DELAYD_REPO_ROOT/target/release/delayd"
fi
[[ -x "$BIN" ]] || die "no delayd binary at $BIN"

# --- RabbitMQ topology -------------------------------------------------------------
banner "declaring the demo exchanges and queues"
PY="$(ensure_venv)"
CONSUMER="$DELAYD_REPO_ROOT/deploy/local/consume.py"
# --purge: leftovers of an earlier run would spoil the count.
"$PY" "$CONSUMER" declare --purge

banner "delayd check --config $CONFIG"
"$BIN" check --config "$CONFIG"

# --- run ---------------------------------------------------------------------------
banner "consumer listening; delayd run in the background (log: $DELAYD_LOG)"
"$PY" "$CONSUMER" consume --count "$MESSAGES" --timeout 30 &
consumer_pid=$!
"$BIN" run --config "$CONFIG" >"$DELAYD_LOG" 2>&1 &
delayd_pid=$!
sleep 1
if ! alive "$delayd_pid"; then
	tail -n 30 "$DELAYD_LOG" >&2
	die "delayd run exited at once (log above)"
fi

banner "scheduling $MESSAGES members over ~5 s; deliveries print as they arrive (lateness = receipt time - x-delayd-due)"
schedule() {
	local business="$1" delay="$2" body="$3"
	printf '  %-14s in %-7s %s\n' "$business" "$delay" "$body"
	"$BIN" schedule --config "$CONFIG" "$business" --in "$delay" "$body"
}
schedule "$ORDER" 1s "order-1001 payment window expired"
schedule "$ORDER" 2s "order-1002 payment window expired"
schedule "$ORDER" 3s "order-1003 payment window expired"
schedule "$ORDER" 4s "order-1004 payment window expired"
schedule "$ORDER" 5s "order-1005 payment window expired"
schedule "$REMINDER" 500ms "reminder-1 call the dentist"
schedule "$REMINDER" 1500ms "reminder-2 water the plants"
schedule "$REMINDER" 2500ms "reminder-3 stand-up meeting"
schedule "$REMINDER" 3500ms "reminder-4 renew the certificate"
schedule "$REMINDER" 4500ms "reminder-5 go home"

consumer_rc=0
wait "$consumer_pid" || consumer_rc=$?
consumer_pid=""

banner "delayd inspect --config $CONFIG"
"$BIN" inspect --config "$CONFIG" || log "delayd inspect failed"

banner "stopping delayd with SIGTERM"
kill -TERM "$delayd_pid" 2>/dev/null || true
delayd_rc=0
wait "$delayd_pid" || delayd_rc=$?
delayd_pid=""
if ((delayd_rc == 0)); then
	echo "delayd exited with code 0 (clean stop)"
else
	echo "delayd exited with code $delayd_rc (NOT a clean stop)"
fi
echo "last lines of $DELAYD_LOG:"
tail -n 15 "$DELAYD_LOG" | sed 's/^/  | /'

if ((consumer_rc != 0)); then
	die "the consumer did not receive all $MESSAGES messages"
fi
if ((delayd_rc != 0)); then
	die "delayd did not exit cleanly (exit code $delayd_rc)"
fi
banner "demo done"
