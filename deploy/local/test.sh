#!/usr/bin/env bash
# THE test command (README, CI): formatting, lints and every test, against a
# project-local Redis and RabbitMQ.
#
#   deploy/local/test.sh [extra args for `cargo test`]
#
# 1. installs the Debian packages it needs (redis-server, rabbitmq-server, a C
#    linker, chromium and chromium-driver for the console's browser tests,
#    promtool for the alert rules, the producer examples' Redis clients)
#    when missing, all but the linker while cargo compiles; cargo itself is
#    assumed;
# 2. runs cargo fmt --check and cargo clippy -D warnings, and builds the
#    release daemon and the test binaries (built lighter: CARGO_TEST in
#    lib.sh);
# 3. starts the servers (deploy/local/servers.sh start), exports
#    DELAYD_TEST_REDIS_URL / DELAYD_TEST_AMQP_URL for the tests, and runs
#    promtool's check and unit tests of deploy/prometheus/alerts.yml, cargo
#    test and the container test (deploy/container/test.sh);
# 4. for each server set in DELAYD_MATRIX (space-separated, e.g.
#    "rabbitmq4-redis8 rabbitmq4-valkey8"; none by default, CI names two), runs
#    the test binaries in DELAYD_MATRIX_TESTS (those that exercise the servers)
#    with the same build against that set (deploy/local/test-set.sh), all sets
#    at once and beside step 3's tests, each on its own ports: its defaults, or
#    DELAYD_REDIS_PORT / DELAYD_AMQP_PORT + 1, + 2, ... when those are set;
#    all run even when one fails, so one report shows every problem;
# 5. exits non-zero if any step failed.
#
# The whole suite runs on DELAYD_SERVERS (deploy/local/lib.sh; default
# rabbitmq3-redis7, Debian 12's RabbitMQ 3.10 and Redis 7.0).
#
# Servers this script started are stopped when it exits; servers that were
# already running are left alone. DELAYD_KEEP_SERVERS=1 keeps them all.
set -euo pipefail

LOG_TAG="test"
# shellcheck source=deploy/local/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# shellcheck source=deploy/local/rabbitmq-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/rabbitmq-lib.sh"
# shellcheck source=deploy/local/redis-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/redis-lib.sh"
cd "$DELAYD_REPO_ROOT"

# --- prerequisites -------------------------------------------------------------
if ! command -v cc >/dev/null 2>&1; then
	# rustc links through the system C compiler.
	apt_install gcc libc6-dev
fi
command -v cargo >/dev/null 2>&1 || die "cargo not found on PATH (install Rust with rustup first)"
mkdir -p "$DELAYD_LOCAL_DIR"
# The servers, the browser and promtool (some minutes of apt on a bare
# machine) are installed while cargo checks and compiles, which needs none
# of them; wait_packages waits for them before the first step that does.
(
	ensure_packages
	ensure_browser
	ensure_promtool
) </dev/null >"$DELAYD_LOCAL_DIR/packages.log" 2>&1 &
packages_pid=$!

# Debian 13's servers for the matrix: built (once) while cargo compiles; the
# sets wait for it through trixie.sh's lock.
if [[ " ${DELAYD_MATRIX:-} " == *" rabbitmq4-"* ]]; then
	mkdir -p "$DELAYD_LOCAL_DIR"
	deploy/local/trixie.sh build </dev/null >"$DELAYD_LOCAL_DIR/trixie-prebuild.log" 2>&1 &
fi

# The producer examples' clients (about 1.5 min on a bare machine: pip, npm,
# apt), installed while cargo compiles; tests/examples.rs waits for them
# through clients.sh's lock, and installs what is still missing itself.
ensure_examples </dev/null >"$DELAYD_LOCAL_DIR/examples-prebuild.log" 2>&1 &

# --- servers -------------------------------------------------------------------
# Remember which servers were down before, so only those are stopped again.
note_servers_to_stop

# Private brokers that tests start with rabbitmq-node.sh and fail to stop
# (a panicking test) would outlive the run; those that ran before are not ours.
preexisting_test_nodes=" $(rmq_test_node_pids | tr '\n' ' ') "
# Likewise the Redis cluster, sentinel and TLS servers tests start once per
# test binary (each also has a watcher that ends it with its binary).
preexisting_redis_nodes=" $(redis_test_node_pids | tr '\n' ' ') "

step_pid=""
matrix_pids=()
cleanup() {
	local rc=$? s pid
	# An install is left to finish: a killed dpkg leaves the machine's
	# packages half configured.
	if [[ -n "${packages_pid:-}" ]] && alive "$packages_pid"; then
		log "waiting for the package install to finish (log: .local/packages.log)"
		wait "$packages_pid" 2>/dev/null || true
	fi
	# Interrupted during a step: stop it before the servers go away.
	# The step runs in its own process group, so test binaries die with cargo.
	for pid in "$step_pid" "${matrix_pids[@]}"; do
		if [[ -n "$pid" ]] && alive "$pid"; then
			kill -TERM -- "-$pid" 2>/dev/null || true
			wait "$pid" 2>/dev/null || true
		fi
	done
	for pid in $(rmq_test_node_pids); do
		if [[ "$preexisting_test_nodes" != *" $pid "* ]]; then
			log "killing leftover test RabbitMQ node (pid $pid)"
			kill -KILL "$pid" 2>/dev/null || true
		fi
	done
	for pid in $(redis_test_node_pids); do
		if [[ "$preexisting_redis_nodes" != *" $pid "* ]]; then
			log "killing leftover test Redis server (pid $pid)"
			kill -KILL "$pid" 2>/dev/null || true
		fi
	done
	stop_noted_servers
	exit "$rc"
}
# Ctrl-C / SIGTERM become a normal exit, so cleanup stops the servers.
exit_trap cleanup

# --- checks --------------------------------------------------------------------
results=()
failed=0
step() {
	local name="$1" t0 rc=0
	shift
	log "==> $*"
	t0="$(date +%s)"
	# In the background + wait, so a SIGTERM to this script is handled at
	# once rather than after the step (bash defers traps until a foreground
	# command ends); setsid gives the step a process group of its own (its
	# pid) that cleanup can signal as a whole.
	setsid "$@" &
	step_pid=$!
	wait "$step_pid" || rc=$?
	step_pid=""
	if ((rc == 0)); then
		results+=("$name: ok ($(($(date +%s) - t0))s)")
	else
		results+=("$name: FAILED with exit code $rc ($(($(date +%s) - t0))s)")
		failed=1
	fi
}

# The binaries that exercise the servers' behaviour (delivery and its faults,
# the intake, tasks by id, recurring schedules, Redis Cluster and Sentinel, TLS
# to both, adoption from the delayed-message plugin built for the set's
# broker); the others test delayd's own logic, which no server version changes.
read -r -a matrix_tests <<<"${DELAYD_MATRIX_TESTS:-delivery faults intake intake_faults intake_nemesis id_mode recurring redis_cluster redis_sentinel redis_tls rabbitmq_tls adopt}"
matrix_sets=()

# start_matrix ARGS: starts every set of DELAYD_MATRIX in the background, each
# on its own servers and into its own log (printed by wait_matrix). Their tests
# mostly wait on servers and timers, so they run beside the whole suite.
start_matrix() {
	local i=0 set t ports matrix_args=()
	for t in "${matrix_tests[@]}"; do
		matrix_args+=(--test "$t")
	done
	for set in ${DELAYD_MATRIX:-}; do
		i=$((i + 1))
		ports=()
		[[ -z "${DELAYD_REDIS_PORT:-}" ]] || ports+=("DELAYD_REDIS_PORT=$((DELAYD_REDIS_PORT + i))")
		[[ -z "${DELAYD_AMQP_PORT:-}" ]] || ports+=("DELAYD_AMQP_PORT=$((DELAYD_AMQP_PORT + i))")
		log "==> $set: deploy/local/test-set.sh ${matrix_args[*]} $* (log: .local/test-$set.log)"
		setsid env "${ports[@]}" deploy/local/test-set.sh "$set" "${matrix_args[@]}" "$@" \
			</dev/null >"$DELAYD_LOCAL_DIR/test-$set.log" 2>&1 &
		matrix_pids+=("$!")
		matrix_sets+=("$set")
	done
	matrix_t0="$(date +%s)"
}

# wait_matrix: waits for every set, prints its log and records its result.
wait_matrix() {
	local i rc
	for i in "${!matrix_sets[@]}"; do
		rc=0
		wait "${matrix_pids[$i]}" || rc=$?
		cat "$DELAYD_LOCAL_DIR/test-${matrix_sets[$i]}.log" >&2
		if ((rc == 0)); then
			results+=("${matrix_sets[$i]}: ok ($(($(date +%s) - matrix_t0))s from the start of the sets)")
		else
			results+=("${matrix_sets[$i]}: FAILED with exit code $rc ($(($(date +%s) - matrix_t0))s from the start of the sets)")
			failed=1
		fi
	done
}

# wait_packages: waits for the install started at the top; without the
# servers no test can run, so a failed install ends the run here.
wait_packages() {
	local rc=0 t0
	t0="$(date +%s)"
	wait "$packages_pid" || rc=$?
	packages_pid=""
	if ((rc != 0)); then
		cat "$DELAYD_LOCAL_DIR/packages.log" >&2
		die "installing the servers, chromium or promtool failed (exit $rc); the lines above say why"
	fi
	results+=("packages: ok (waited $(($(date +%s) - t0))s after the build)")
}

step "format" cargo fmt --all -- --check
step "clippy" cargo clippy --all-targets -- -D warnings
log "==> cargo build --release --bin delayd (the daemon the tests run)"
daemon_t0="$(date +%s)"
use_release_daemon
results+=("daemon: ok ($(($(date +%s) - daemon_t0))s)")
# The test binaries, built once for every set.
step "build " "${CARGO_TEST[@]}" --no-run "$@"
wait_packages
step "alerts" sh -c 'promtool check rules deploy/prometheus/alerts.yml && promtool test rules deploy/prometheus/alerts.test.yml'

start_servers
# Fault tests run their own broker through this script.
export DELAYD_TEST_RABBITMQ_NODE_SCRIPT="$DELAYD_REPO_ROOT/deploy/local/rabbitmq-node.sh"
export RUST_BACKTRACE="${RUST_BACKTRACE:-1}"
log "DELAYD_TEST_REDIS_URL=$DELAYD_TEST_REDIS_URL"
log "DELAYD_TEST_AMQP_URL=$DELAYD_TEST_AMQP_URL"
# Beside the suite: their tests mostly wait on servers and timers, and after
# it they would add some 7 minutes. (Their Sentinel failover once ran past its
# bound here: the sentinels were holding back after an aborted try, which
# redis-sentinel.sh's `ready` now waits out.)
start_matrix "$@"
# --no-fail-fast: run every test binary even after one fails.
step "tests " "${CARGO_TEST[@]}" --no-fail-fast "$@"
if [[ "$SET_RABBITMQ" == 4 ]]; then
	# Ignored by default: tests that need RabbitMQ 4 (tests/intake_amqp10.rs).
	step "rabbitmq 4" "${CARGO_TEST[@]}" --test intake_amqp10 -- --include-ignored
fi
# The image, built and run beside the same servers. It installs podman as
# root; elsewhere it runs only where podman already is.
if [[ -n "${CI:-}" || "$(id -u)" == 0 ]] || command -v podman >/dev/null 2>&1; then
	step "image " deploy/container/test.sh
else
	results+=("image : skipped (no podman, and not root to install it)")
fi
wait_matrix

log "summary:"
for r in "${results[@]}"; do
	log "  $r"
done
if ((failed)); then
	log "FAILED"
	exit 1
fi
log "all checks passed"
