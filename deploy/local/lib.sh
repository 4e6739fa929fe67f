# shellcheck shell=bash
# Shared helpers for the deploy/local scripts. Sourced, never executed.
#
# Everything here runs servers as plain background processes (no docker, no
# systemd) and keeps their state under a directory we own, so a developer
# machine and CI behave the same way.

# The repo root is two levels above this file; all local state lives in
# <repo>/.local (git-ignored).
DELAYD_REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)"
# shellcheck disable=SC2034 # used by the scripts that source this file
DELAYD_LOCAL_DIR="${DELAYD_REPO_ROOT}/.local"

# The Debian /usr/sbin/rabbitmq* wrappers `su` to the rabbitmq user when run as
# root, which would then use /var/lib/rabbitmq and its cookie. The real scripts
# live here and run fine as any user, including root.
RABBITMQ_LIBEXEC="/usr/lib/rabbitmq/bin"

# How long `start` waits for a server to accept work.
DELAYD_START_TIMEOUT="${DELAYD_START_TIMEOUT:-60}"

log() { printf '[%s] %s\n' "${LOG_TAG:-delayd-local}" "$*" >&2; }
die() {
	log "ERROR: $*"
	exit 1
}

# now_ms: wall clock in milliseconds (for timings we print).
now_ms() { date +%s%3N; }

# alive PID: true if PID exists and is not a zombie. Orphans are not always
# reaped in this sandbox (pid 1 is not a real init), so `kill -0` alone would
# report a dead server as running.
alive() {
	local pid="$1" state
	[[ "$pid" =~ ^[0-9]+$ ]] || return 1
	state="$(sed -e 's/^.*) //' "/proc/${pid}/stat" 2>/dev/null | cut -d' ' -f1)" || return 1
	[[ -n "$state" && "$state" != "Z" && "$state" != "X" ]]
}

# env_has PID GREP_ARGS...: the environment of process PID has a variable
# GREP_ARGS match (as a line of its own). grep reads the file itself: behind
# `tr |` it may quit at its match while tr still writes, and pipefail takes
# tr's SIGPIPE as no match (a running node then looked stopped, and its
# restart found its own port taken).
env_has() {
	local pid="$1"
	shift
	grep -zqs "$@" "/proc/${pid}/environ"
}

# read_pid FILE: prints the pid stored in FILE, or nothing.
read_pid() {
	local f="$1" pid=""
	if [[ -r "$f" ]]; then
		read -r pid <"$f" 2>/dev/null || true
	fi
	[[ "$pid" =~ ^[0-9]+$ ]] && printf '%s\n' "$pid"
	return 0
}

# port_open PORT: something accepts TCP connections on 127.0.0.1:PORT.
port_open() {
	# A subshell so the fd is closed again right away.
	(exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# port_holder PORT: what listens on or holds 127.0.0.1:PORT, as ss(8)
# shows it (the process where it is allowed to say), for error lines.
port_holder() {
	local found
	found="$(ss -Htanp "( sport = :$1 )" 2>/dev/null | head -3 | tr -s ' ' | tr '\n' ';')" || true
	printf '%s' "${found:-ss shows no socket}"
}

# amqp_answers PORT: an AMQP 0-9-1 broker answers the protocol header with
# connection.start (frame type 1, channel 0, class 10, method 10). Stronger
# than an open port: the listener is up only once the broker has booted.
amqp_answers() {
	local port="$1" hex
	# shellcheck disable=SC2016 # expanded by the inner bash
	hex="$(timeout 3 bash -c '
		exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
		printf "AMQP\x00\x00\x09\x01" >&3
		head -c 11 <&3 | od -An -tx1 | tr -d " \n"
	' _ "$port" 2>/dev/null)" || return 1
	[[ "$hex" == 010000* && "${hex:14:8}" == "000a000a" ]]
}

# redis_answers PORT: redis-cli ping gets PONG.
redis_answers() {
	[[ "$(timeout 3 redis-cli -h 127.0.0.1 -p "$1" ping 2>/dev/null)" == "PONG" ]]
}

# valid_port VALUE NAME: dies unless VALUE is a TCP port number.
valid_port() {
	if ! [[ "$1" =~ ^[0-9]+$ ]] || (($1 < 1 || $1 > 65535)); then
		die "$2 must be a TCP port (1-65535), got '$1'"
	fi
}

# dist_port AMQP_PORT OFFSET: a RabbitMQ node's Erlang distribution port:
# DELAYD_RABBITMQ_DIST_PORT when set, else AMQP_PORT + OFFSET (or - OFFSET
# where + would pass 65535). Dies unless the result is a TCP port.
dist_port() {
	local dist
	if (($1 + $2 <= 65535)); then
		dist="${DELAYD_RABBITMQ_DIST_PORT:-$(($1 + $2))}"
	else
		dist="${DELAYD_RABBITMQ_DIST_PORT:-$(($1 - $2))}"
	fi
	valid_port "$dist" DELAYD_RABBITMQ_DIST_PORT
	printf '%s\n' "$dist"
}

# ensure_packages: installs redis-server and rabbitmq-server from Debian when
# their binaries are missing (a fresh machine has neither).
ensure_packages() {
	local missing=()
	command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
	command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
	[[ -x "${RABBITMQ_LIBEXEC}/rabbitmq-server" ]] || missing+=(rabbitmq-server)
	command -v epmd >/dev/null 2>&1 || missing+=(erlang-base)
	((${#missing[@]} == 0)) || apt_install "${missing[@]}"
	if [[ "$DELAYD_SERVERS" != rabbitmq3-redis7 ]]; then
		"$DELAYD_REPO_ROOT/deploy/local/trixie.sh" build
	fi
}

# ensure_browser: installs Debian's chromium and chromium-driver when missing,
# for the console's browser tests (tests/console_browser.rs).
ensure_browser() {
	local missing=()
	command -v chromium >/dev/null 2>&1 || missing+=(chromium)
	command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
	((${#missing[@]} == 0)) && return 0
	apt_install "${missing[@]}"
}

# ensure_promtool: installs Debian's prometheus package, for promtool, which
# checks and unit-tests deploy/prometheus/alerts.yml; without recommends, and
# its service is not started (apt_install's policy-rc.d).
ensure_promtool() {
	command -v promtool >/dev/null 2>&1 || apt_install --no-install-recommends prometheus
}

# ensure_examples: the Redis clients of the producer examples (examples/,
# run by tests/examples.rs): redis-py and ioredis under .local, Debian's
# ruby-redis and php-redis (deploy/local/clients.sh).
ensure_examples() {
	"$DELAYD_REPO_ROOT/deploy/local/clients.sh" all
}

# apt_install PKG...: non-interactive install that does not start services.
apt_install() {
	log "installing Debian packages: $*"
	[[ "$(id -u)" == 0 ]] || die "need root to apt-get install $* (or install them yourself)"
	export DEBIAN_FRONTEND=noninteractive
	# One install at a time, policy-rc.d included: installs run beside each
	# other (the Debian 13 tree, the examples' clients), and dpkg's lock
	# refuses a second apt-get.
	exec 8>/var/lock/delayd-apt.lock
	flock 8
	# Package postinst scripts would start the system redis/rabbitmq on our
	# ports (6379/5672) via invoke-rc.d; a policy-rc.d that answers 101 stops
	# that. Put one in place only if the machine has none, and remove it after.
	local policy=/usr/sbin/policy-rc.d added_policy=0 rc=0
	if [[ ! -e "$policy" ]]; then
		printf '#!/bin/sh\nexit 101\n' >"$policy"
		chmod 755 "$policy"
		added_policy=1
	fi
	apt-get update -q || rc=$?
	if ((rc == 0)); then
		apt-get install -y -q "$@" || rc=$?
	fi
	if ((added_policy)); then
		rm -f "$policy"
	fi
	exec 8>&-
	((rc == 0)) || die "apt-get failed (exit $rc) installing: $*"
}

# ensure_venv: prints the python of <repo>/.local/venv, a virtualenv with pika
# (the demo consumer's only dependency), so the system Python stays clean.
ensure_venv() {
	local venv="$DELAYD_LOCAL_DIR/venv"
	if ! "$venv/bin/python" -c 'import pika' >/dev/null 2>&1; then
		mkdir -p "$DELAYD_LOCAL_DIR"
		# One builder at a time: test binaries on several server sets ask
		# at once, and a venv half made by another has no pip yet.
		(
			flock 9
			make_venv "$venv"
		) 9>"$DELAYD_LOCAL_DIR/venv.lock" || die "could not make $venv with pika"
	fi
	printf '%s\n' "$venv/bin/python"
}

# make_venv DIR: a venv in DIR with pika, unless one is there already.
make_venv() {
	local venv="$1" py
	! "$venv/bin/python" -c 'import pika' >/dev/null 2>&1 || return 0
	# A venv whose interpreter went away (e.g. another Python) is rebuilt.
	if ! "$venv/bin/python" -c 'import sys' >/dev/null 2>&1; then
		rm -rf "$venv"
		py="$(command -v python3 || true)"
		if [[ -z "$py" ]] || ! "$py" -m venv "$venv" >&2; then
			rm -rf "$venv"
			apt_install python3 python3-venv
			/usr/bin/python3 -m venv "$venv" >&2
		fi
	fi
	log "installing pika into $venv"
	"$venv/bin/python" -m pip install -q --disable-pip-version-check 'pika>=1.3,<2' >&2 ||
		die "pip could not install pika into $venv"
}

# wait_until SECONDS DESCRIPTION COMMAND...: retries COMMAND (quietly) until
# it succeeds; dies naming DESCRIPTION after SECONDS.
wait_until() {
	local limit="$1" what="$2" t0
	shift 2
	t0="$(now_ms)"
	until "$@" >/dev/null 2>&1; do
		if (($(now_ms) - t0 > limit * 1000)); then
			die "$what not reached within ${limit}s"
		fi
		sleep 0.1
	done
}

# --- the test build ------------------------------------------------------------
# The test binaries and the daemon they start build at opt-level 1 without
# debug info (a fifth of a release compile), on the release-built
# dependencies a `cargo build --release` shares. The daemon as shipped
# (opt-level 3) is built by the image and run by the container test; speed
# is measured at that level by `delayd bench`, not by the suite.
# shellcheck disable=SC2034 # used by the scripts that source this file
CARGO_TEST=(cargo test --release
	--config 'profile.release.package.delayd.opt-level=1'
	--config 'profile.release.package.delayd.debug=0')

# LOWEST_PRIORITY CMD...: runs CMD at the lowest CPU priority, including
# towards other sessions. With scheduler autogroups (Debian's default) each
# session (setsid) shares the CPU as one group and a nice value counts only
# inside its own group, so the group is niced as well.
# shellcheck disable=SC2034,SC2016 # used by the scripts that source this file
LOWEST_PRIORITY=(bash -c 'echo 19 >/proc/self/autogroup 2>/dev/null || true; exec nice -n 19 "$@"' lowest-priority)

# usage: prints the usage lines of the running script's header (those that
# start with "#   deploy/.../<its name> ") to stderr and exits 2, so a header
# can grow without a line number to keep in step.
usage() {
	local name
	name="$(basename "$0")"
	grep -E "^#   deploy/[a-z]+/${name//./\\.} " "$0" | sed 's/^#   //' >&2
	exit 2
}

# The shared servers that were down before this script ran: only those are
# stopped again at exit. Sets the global array to_stop.
note_servers_to_stop() {
	to_stop=()
	"$DELAYD_REPO_ROOT/deploy/local/servers.sh" status redis >/dev/null 2>&1 || to_stop+=(redis)
	"$DELAYD_REPO_ROOT/deploy/local/servers.sh" status rabbitmq >/dev/null 2>&1 || to_stop+=(rabbitmq)
}

# start_servers: starts (or reuses) the shared servers and exports their
# DELAYD_TEST_REDIS_URL and DELAYD_TEST_AMQP_URL.
start_servers() {
	"$DELAYD_REPO_ROOT/deploy/local/servers.sh" start
	eval "$("$DELAYD_REPO_ROOT/deploy/local/servers.sh" env)"
}

# exit_trap FN: runs FN at exit, also after Ctrl-C or SIGTERM, which become
# exits 130 and 143 so that FN runs and sees why.
exit_trap() {
	# shellcheck disable=SC2064 # FN is meant to be fixed now
	trap "$1" EXIT
	trap 'exit 130' INT
	trap 'exit 143' TERM
}

# Stops the servers listed in to_stop, unless DELAYD_KEEP_SERVERS=1.
stop_noted_servers() {
	local s
	if [[ "${DELAYD_KEEP_SERVERS:-0}" == 1 ]]; then
		log "DELAYD_KEEP_SERVERS=1: leaving the servers running"
		return
	fi
	for s in "${to_stop[@]}"; do
		"$DELAYD_REPO_ROOT/deploy/local/servers.sh" stop "$s" || true
	done
}

# --- server sets -----------------------------------------------------------------
# DELAYD_SERVERS names the servers every script here (and the tests, through
# PATH and the variables servers.sh env prints) runs:
#   rabbitmq3-redis7   Debian 12's RabbitMQ 3.10 and Redis 7.0, installed on the system (default)
#   rabbitmq4-redis8   Debian 13's RabbitMQ 4.0 (Erlang 27) and Redis 8.0 } from deploy/local/trixie.sh,
#   rabbitmq4-valkey8  Debian 13's RabbitMQ 4.0 (Erlang 27) and Valkey 8.1 } in <repo>/.local/trixie
# Each set has its own default ports and state directories, so sets run side by
# side and a server of one set is never taken for another's (servers.sh checks
# the versions that answer).
DELAYD_SERVER_SETS="rabbitmq3-redis7 rabbitmq4-redis8 rabbitmq4-valkey8"
DELAYD_SERVERS="${DELAYD_SERVERS:-rabbitmq3-redis7}"
# Another set's commands (from an outer script that ran one) never shadow this set's.
PATH=":$PATH:"
PATH="${PATH//:$DELAYD_REPO_ROOT\/deploy\/local\/trixie-bin:/:}"
PATH="${PATH#:}"
PATH="${PATH%:}"
case "$DELAYD_SERVERS" in
rabbitmq3-redis7)
	SET_REDIS_PORT=6379 SET_AMQP_PORT=5672 SET_STATE_DIR="$DELAYD_LOCAL_DIR"
	SET_RABBITMQ=3 SET_REDIS=redis-7 SET_KHEPRI=
	;;
rabbitmq4-redis8 | rabbitmq4-valkey8)
	# One RabbitMQ 4 set keeps its metadata in Khepri (the only store of
	# RabbitMQ 4.3), the other in Mnesia: the matrix covers both.
	if [[ "$DELAYD_SERVERS" == *valkey8 ]]; then
		SET_REDIS_PORT=6580 SET_AMQP_PORT=5872 SET_REDIS=valkey-8 SET_KHEPRI=1
	else
		SET_REDIS_PORT=6480 SET_AMQP_PORT=5772 SET_REDIS=redis-8 SET_KHEPRI=
	fi
	SET_RABBITMQ=4 SET_STATE_DIR="$DELAYD_LOCAL_DIR/$DELAYD_SERVERS"
	# redis-server, redis-cli, rabbitmq-server and rabbitmqctl from the tree.
	RABBITMQ_LIBEXEC="$DELAYD_REPO_ROOT/deploy/local/trixie-bin"
	case ":$PATH:" in
	*":$RABBITMQ_LIBEXEC:"*) ;;
	*) PATH="$RABBITMQ_LIBEXEC:$PATH" ;;
	esac
	export PATH
	;;
*) die "DELAYD_SERVERS must be one of: $DELAYD_SERVER_SETS (got '$DELAYD_SERVERS')" ;;
esac
export DELAYD_SERVERS
# shellcheck disable=SC2034 # used by the scripts that source this file
readonly SET_REDIS_PORT SET_AMQP_PORT SET_STATE_DIR SET_RABBITMQ SET_REDIS SET_KHEPRI

# redis_version PORT: "redis-7.0.15" or "valkey-8.1.1", from INFO server.
redis_version() {
	local info v
	info="$(timeout 3 redis-cli -h 127.0.0.1 -p "$1" info server 2>/dev/null | tr -d '\r')" || return 1
	v="$(sed -n 's/^valkey_version://p' <<<"$info")"
	if [[ -n "$v" ]]; then
		printf 'valkey-%s\n' "$v"
	else
		v="$(sed -n 's/^redis_version://p' <<<"$info")"
		[[ -n "$v" ]] && printf 'redis-%s\n' "$v"
	fi
}

# amqp_version PORT: the broker's version, from the server properties of its
# connection.start ("version" is a long string: S, 4 length bytes, text).
amqp_version() {
	# shellcheck disable=SC2016 # expanded by the inner bash
	timeout 3 bash -c '
		exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
		printf "AMQP\x00\x00\x09\x01" >&3
		read -r -a h < <(head -c 7 <&3 | od -An -tu1)
		head -c $(((h[3] << 24) + (h[4] << 16) + (h[5] << 8) + h[6])) <&3 | tr -c "[:alnum:]._-" " "
	' _ "$1" 2>/dev/null | grep -oE 'versionS {4}[0-9][0-9.]*' | head -n1 | awk '{print $2}'
}
