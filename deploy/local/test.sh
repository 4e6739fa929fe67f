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
# 2. runs cargo fmt --check, and builds the test binaries and the daemon
#    they run (built lighter: CARGO_TEST in lib.sh);
# 3. starts the servers (deploy/local/servers.sh start), exports
#    DELAYD_TEST_REDIS_URL / DELAYD_TEST_AMQP_URL for the tests, runs
#    promtool's check and unit tests of deploy/prometheus/alerts.yml, then,
#    all at once: cargo test (without extra args, the binaries that mostly
#    wait, DELAYD_TEST_BESIDE, in a second cargo run beside the rest; with
#    DELAYD_TEST_SHARDS=N, N cargo runs over a share of the binaries each,
#    balanced by their usual times) and step 4's sets; after the tests, the container test
#    (deploy/container/test.sh) with the image built meanwhile (cargo clippy
#    -D warnings and the image's build start first, at the lowest CPU
#    priority, and run beside everything else);
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
bg_pids=()
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
	for pid in "$step_pid" "${bg_pids[@]}"; do
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

# --- work beside the tests --------------------------------------------------------
# Jobs started in the background, each in its own process group and log, and
# waited for by name: the matrix's sets, the suite's shards, and the lints
# and the image build (those at the lowest CPU priority, so the timed tests
# beside them keep the machine).
bg_names=()
bg_logs=()

# bg_step NAME LOG CMD...: starts CMD in the background, its output to LOG.
bg_step() {
	local name="$1" out="$2"
	shift 2
	log "==> $name: $* (log: ${out#"$DELAYD_REPO_ROOT"/})"
	rm -f "$out.secs"
	# The job notes its own time: it may end long before it is waited for.
	# shellcheck disable=SC2016 # expanded by the job's shell
	setsid bash -c 't0=$(date +%s); rc=0; "$@" || rc=$?; echo $(($(date +%s) - t0)) >"$0.secs"; exit $rc' \
		"$out" "$@" </dev/null >"$out" 2>&1 &
	bg_pids+=("$!")
	bg_names+=("$name")
	bg_logs+=("$out")
}

# wait_bg NAME...: waits for the named jobs (every job when none is named),
# prints each one's log and records its result.
wait_bg() {
	local i rc secs want=" $* "
	for i in "${!bg_names[@]}"; do
		[[ -n "${bg_pids[$i]}" ]] || continue
		(($# == 0)) || [[ "$want" == *" ${bg_names[$i]} "* ]] || continue
		rc=0
		wait "${bg_pids[$i]}" || rc=$?
		cat "${bg_logs[$i]}" >&2
		secs="$(cat "${bg_logs[$i]}.secs" 2>/dev/null || echo "?")"
		if ((rc == 0)); then
			results+=("${bg_names[$i]}: ok (${secs}s)")
		else
			results+=("${bg_names[$i]}: FAILED with exit code $rc (${secs}s)")
			failed=1
		fi
		bg_pids[i]=""
	done
}

# The binaries that exercise the servers' behaviour (delivery and its faults,
# the intake, tasks by id, recurring schedules, Redis Cluster and Sentinel, TLS
# to both); the others test delayd's own logic, which no server version changes.
read -r -a matrix_tests <<<"${DELAYD_MATRIX_TESTS:-delivery faults intake intake_faults intake_nemesis id_mode recurring redis_cluster redis_sentinel redis_tls rabbitmq_tls}"
# Run on the first set only: adoption from the delayed-message plugin built
# for the set's broker depends on RabbitMQ, not on Redis or Valkey, and the
# sets share one RabbitMQ version.
read -r -a matrix_first_tests <<<"${DELAYD_MATRIX_FIRST_TESTS:-adopt}"

# start_matrix ARGS: starts every set of DELAYD_MATRIX, each on its own
# servers. Their tests mostly wait on servers and timers, so they run beside
# the whole suite.
start_matrix() {
	local i=0 set t ports matrix_args=() first_args=()
	for t in "${matrix_tests[@]}"; do
		matrix_args+=(--test "$t")
	done
	for t in "${matrix_first_tests[@]}"; do
		first_args+=(--test "$t")
	done
	for set in ${DELAYD_MATRIX:-}; do
		i=$((i + 1))
		((i == 1)) || first_args=()
		ports=()
		[[ -z "${DELAYD_REDIS_PORT:-}" ]] || ports+=("DELAYD_REDIS_PORT=$((DELAYD_REDIS_PORT + i))")
		[[ -z "${DELAYD_AMQP_PORT:-}" ]] || ports+=("DELAYD_AMQP_PORT=$((DELAYD_AMQP_PORT + i))")
		bg_step "$set" "$DELAYD_LOCAL_DIR/test-$set.log" \
			env "${ports[@]}" deploy/local/test-set.sh "$set" "${matrix_args[@]}" "${first_args[@]}" "$@"
	done
}

# Seconds each test binary took in a whole run on a 2-core VM (those not
# named here count as 10): only to balance the shards.
declare -A test_secs=(
	[adopt]=200 [redis_sentinel]=170 [intake_faults]=114 [rabbitmq_cluster]=110 [loss]=105
	[redis_cluster]=80 [intake_nemesis]=69 [faults]=55
	[recurring]=35 [rabbitmq_tls]=30 [intake]=30 [id_mode]=29
	[console_browser]=26 [delivery]=21 [rate]=21 [cli]=17 [schedules_api]=14
)

# plan_shards N: N lines, each the --test arguments of one shard: the
# longest binaries first, each to the shard with the least time so far. The
# last line also takes the unit tests.
plan_shards() {
	local n="$1" f name secs i best totals=() shards=()
	for ((i = 0; i < n; i++)); do
		totals+=(0)
		shards+=("")
	done
	while read -r secs name; do
		best=0
		for ((i = 1; i < n; i++)); do
			((totals[i] >= totals[best])) || best=$i
		done
		totals[best]=$((totals[best] + secs))
		shards[best]+=" --test $name"
	done < <(for f in tests/*.rs; do
		name="$(basename "$f" .rs)"
		echo "${test_secs[$name]:-10} $name"
	done | sort -rn)
	shards[n - 1]+=" --lib --bins"
	printf '%s\n' "${shards[@]}"
}

# The binaries whose time is mostly waiting (plugin messages coming due,
# Sentinel failovers, RabbitMQ nodes booting and joining): without
# arguments they run as a second cargo run beside the rest of the suite,
# which they would otherwise lengthen by some 8 minutes. Empty: one run.
read -r -a beside_tests <<<"${DELAYD_TEST_BESIDE-adopt redis_sentinel rabbitmq_cluster}"

# split_beside: two lines, the --test arguments of the binaries beside, then
# the targets of the rest (with the unit tests).
split_beside() {
	local f name beside="" rest="--lib --bins"
	for f in tests/*.rs; do
		name="$(basename "$f" .rs)"
		if [[ " ${beside_tests[*]} " == *" $name "* ]]; then
			beside+=" --test $name"
		else
			rest+=" --test $name"
		fi
	done
	printf '%s\n%s\n' "$beside" "$rest"
}

# start_shards N ARGS: the whole suite as N cargo runs at once. Most of its
# time is spent waiting on servers, restarts and timers, so two runs on two
# cores take little more than the longer of them.
start_shards() {
	local n="$1" k=0 targets
	shift
	while read -r targets; do
		k=$((k + 1))
		# shellcheck disable=SC2086 # one word per target argument
		bg_step "tests-$k/$n" "$DELAYD_LOCAL_DIR/test-shard-$k.log" \
			"${CARGO_TEST[@]}" --no-fail-fast $targets "$@"
	done < <(plan_shards "$n")
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

# The lints and the image build need the CPU only, not the clock: started
# first at the lowest priority, they take what the builds and tests leave
# (a build's serial stretches, the tests' waits). Clippy checks into a
# target directory of its own, so it never waits on the build's lock. The
# image is built as root or where podman is; its checks run after the tests.
bg_step "clippy" "$DELAYD_LOCAL_DIR/clippy.log" \
	env CARGO_TARGET_DIR="$DELAYD_REPO_ROOT/target/clippy" "${LOWEST_PRIORITY[@]}" cargo clippy --workspace --all-targets -- -D warnings
image=0
if [[ -n "${CI:-}" || "$(id -u)" == 0 ]] || command -v podman >/dev/null 2>&1; then
	image=1
	bg_step "image build" "$DELAYD_LOCAL_DIR/image-build.log" "${LOWEST_PRIORITY[@]}" deploy/container/test.sh --build-only
fi
step "format" cargo fmt --all -- --check
# The test binaries and the daemon they run, built once for every set.
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
# DELAYD_TEST_SHARDS=2 splits the suite into two cargo runs at once. Beside
# both matrix sets and the background builds that drove a 2-core VM to a
# load average of 22, and large-body and search tests ran out of their
# bounds, so one run is the default.
shards="${DELAYD_TEST_SHARDS:-1}"
if (($# == 0 && shards > 1)); then
	start_shards "$shards"
	wait_bg $(for ((k = 1; k <= shards; k++)); do echo "tests-$k/$shards"; done)
elif (($# == 0 && ${#beside_tests[@]} > 0)); then
	{ read -r beside_targets && read -r rest_targets; } < <(split_beside)
	# shellcheck disable=SC2086 # one word per target argument
	bg_step "tests beside" "$DELAYD_LOCAL_DIR/test-beside.log" \
		"${CARGO_TEST[@]}" --no-fail-fast $beside_targets
	# shellcheck disable=SC2086
	step "tests " "${CARGO_TEST[@]}" --no-fail-fast $rest_targets
	wait_bg "tests beside"
else
	# Arguments name what to run: one cargo run, as given.
	step "tests " "${CARGO_TEST[@]}" --no-fail-fast "$@"
fi
if [[ "$SET_RABBITMQ" == 4 ]]; then
	# Ignored by default: tests that need RabbitMQ 4 (tests/intake_amqp10.rs).
	step "rabbitmq 4" "${CARGO_TEST[@]}" --test intake_amqp10 -- --include-ignored
fi
if ((image)); then
	wait_bg "image build"
	step "image " deploy/container/test.sh
else
	results+=("image : skipped (no podman, and not root to install it)")
fi
wait_bg

log "summary:"
for r in "${results[@]}"; do
	log "  $r"
done
if ((failed)); then
	log "FAILED"
	exit 1
fi
log "all checks passed"
