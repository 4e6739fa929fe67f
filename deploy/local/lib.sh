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
	((${#missing[@]} == 0)) && return 0
	apt_install "${missing[@]}"
}

# apt_install PKG...: non-interactive install that does not start services.
apt_install() {
	log "installing Debian packages: $*"
	[[ "$(id -u)" == 0 ]] || die "need root to apt-get install $* (or install them yourself)"
	export DEBIAN_FRONTEND=noninteractive
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
	((rc == 0)) || die "apt-get failed (exit $rc) installing: $*"
}

# ensure_epmd: the Erlang port mapper, which every Erlang node (and
# rabbitmqctl) needs to find a node by name. Erlang would start it itself, but
# starting it here makes it listen on loopback only and detaches it from our
# stdout (CI waits for every holder of its pipe to close).
ensure_epmd() {
	if epmd -names >/dev/null 2>&1; then
		return 0
	fi
	ERL_EPMD_ADDRESS=127.0.0.1 epmd -daemon </dev/null >/dev/null 2>&1 || true
	local i
	for ((i = 0; i < 50; i++)); do
		epmd -names >/dev/null 2>&1 && return 0
		sleep 0.1
	done
	die "epmd (Erlang port mapper, port 4369) did not start"
}

# stop_epmd_if_idle: stops epmd when no Erlang node is registered any more, so
# a full `stop` leaves nothing behind; a node that still runs keeps it.
stop_epmd_if_idle() {
	local names
	names="$(epmd -names 2>/dev/null)" || return 0
	if ! grep -q '^name ' <<<"$names"; then
		epmd -kill >/dev/null 2>&1 || true
	fi
}

# --- RabbitMQ node helpers -------------------------------------------------
# A node is described by: DIR (all its state), NODENAME, AMQP_PORT, DIST_PORT.
# Layout of DIR:
#   home/.erlang.cookie  private cookie (HOME points here for server and CLI)
#   mnesia/              database (durable queues, messages, feature flags)
#   log/                 RabbitMQ's own log: log/<nodename>.log
#   stdout.log           stdout/stderr of the server process
#   rabbitmq.conf, enabled_plugins, rabbitmq-env.conf
#   rabbitmq.pid         pid of the Erlang VM (written by RabbitMQ)
#   wrapper.pid          pid of the rabbitmq-server shell wrapper (ours)

# rmq_prepare DIR: creates the directory layout and config files.
rmq_prepare() {
	local dir="$1"
	mkdir -p "$dir/home" "$dir/mnesia" "$dir/log"
	# One random cookie per node directory, or DELAYD_RABBITMQ_COOKIE for
	# nodes that form a cluster; Erlang refuses a cookie file that others can
	# read, hence 0400.
	if [[ -n "${DELAYD_RABBITMQ_COOKIE:-}" ]]; then
		rm -f "$dir/home/.erlang.cookie"
		(
			umask 077
			printf '%s' "$DELAYD_RABBITMQ_COOKIE" >"$dir/home/.erlang.cookie"
		)
	elif [[ ! -s "$dir/home/.erlang.cookie" ]]; then
		(
			umask 077
			# 96 upper-case letters from 48 random bytes (hex digits mapped to A-P).
			head -c 48 /dev/urandom | od -An -tx1 | tr -d ' \n' | tr '0-9a-f' 'A-P' >"$dir/home/.erlang.cookie"
		)
	fi
	chmod 400 "$dir/home/.erlang.cookie"
	# No plugins: delayd needs plain AMQP only, and fewer plugins boot faster.
	printf '[].\n' >"$dir/enabled_plugins"
	cat >"$dir/rabbitmq.conf" <<'EOF'
# Generated by deploy/local/lib.sh: a private development/test node.
# Listener address and port come from RABBITMQ_NODE_IP_ADDRESS/_PORT.
# guest/guest is allowed from loopback (RabbitMQ's default).
loopback_users.guest = true
log.console = false
log.file.level = info
EOF
	# An empty env file stops the scripts from sourcing the system's
	# /etc/rabbitmq/rabbitmq-env.conf.
	: >"$dir/rabbitmq-env.conf"
	[[ -z "${DELAYD_RABBITMQ_TLS_PORT:-}" ]] || rmq_prepare_tls "$dir"
}

# rmq_prepare_tls DIR: an SSL listener on DELAYD_RABBITMQ_TLS_PORT with the
# certificates of deploy/local/certs.sh in DELAYD_RABBITMQ_TLS_CERTS. Clients
# must present a certificate signed by its CA (verify_peer,
# fail_if_no_peer_cert); they may log in with it (EXTERNAL, as the user
# named by the certificate's CN, "delayd", created here without a password).
rmq_prepare_tls() {
	local dir="$1" certs="${DELAYD_RABBITMQ_TLS_CERTS:?DELAYD_RABBITMQ_TLS_CERTS must name a deploy/local/certs.sh directory}"
	valid_port "$DELAYD_RABBITMQ_TLS_PORT" DELAYD_RABBITMQ_TLS_PORT
	certs="$(cd "$certs" && pwd -P)"
	printf '[rabbitmq_auth_mechanism_ssl].\n' >"$dir/enabled_plugins"
	cat >>"$dir/rabbitmq.conf" <<EOF
listeners.ssl.default = 127.0.0.1:$DELAYD_RABBITMQ_TLS_PORT
ssl_options.cacertfile = $certs/ca.crt
ssl_options.certfile = $certs/server.crt
ssl_options.keyfile = $certs/server.key
ssl_options.verify = verify_peer
ssl_options.fail_if_no_peer_cert = true
auth_mechanisms.1 = PLAIN
auth_mechanisms.2 = AMQPLAIN
auth_mechanisms.3 = EXTERNAL
ssl_cert_login_from = common_name
load_definitions = $dir/definitions.json
EOF
	# guest/guest as on every node (salted SHA-256, RabbitMQ's format), plus
	# the certificate's user.
	local salt hash
	command -v openssl >/dev/null 2>&1 || apt_install openssl
	# Four random bytes as printf escapes (\xNN), so no NUL passes through a variable.
	salt="$(head -c 4 /dev/urandom | od -An -tx1 | tr -d ' \n' | sed 's/../\\x&/g')"
	hash="$({
		printf '%b' "$salt"
		{
			printf '%b' "$salt"
			printf guest
		} | openssl dgst -sha256 -binary
	} | base64 -w0)"
	cat >"$dir/definitions.json" <<EOF
{"users": [
  {"name": "guest", "password_hash": "$hash", "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": ["administrator"]},
  {"name": "delayd", "password_hash": "", "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": []}],
 "vhosts": [{"name": "/"}],
 "permissions": [
  {"user": "guest", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"},
  {"user": "delayd", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"}]}
EOF
}

# rmq_watch DIR NODENAME AMQP_PORT PID: leaves a background watcher that
# kills the node once process PID has exited (a test binary, which has no
# teardown of its own). Detached from the caller's pipes and session.
rmq_watch() {
	local dir="$1" node="$2" port="$3" pid="$4"
	setsid bash -c '
		source "$1"
		while kill -0 "$5" 2>/dev/null; do sleep 1; done
		rmq_kill "$2" "$3" "$4"
	' rmq-watch "$DELAYD_REPO_ROOT/deploy/local/lib.sh" "$dir" "$node" "$port" "$pid" </dev/null >>"$dir/watch.log" 2>&1 &
}

# rmq_env DIR NODENAME AMQP_PORT DIST_PORT: exports what the RabbitMQ scripts
# (server and CLI) need to use this node and only this node. Call it in a
# subshell.
rmq_env() {
	local dir="$1"
	export HOME="$dir/home"
	export RABBITMQ_NODENAME="$2"
	export RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
	export RABBITMQ_NODE_PORT="$3"
	export RABBITMQ_DIST_PORT="$4"
	export RABBITMQ_MNESIA_BASE="$dir/mnesia"
	export RABBITMQ_LOG_BASE="$dir/log"
	export RABBITMQ_CONFIG_FILE="$dir/rabbitmq.conf"
	export RABBITMQ_ADVANCED_CONFIG_FILE="$dir/advanced.config"
	export RABBITMQ_ENABLED_PLUGINS_FILE="$dir/enabled_plugins"
	export RABBITMQ_CONF_ENV_FILE="$dir/rabbitmq-env.conf"
	export RABBITMQ_PID_FILE="$dir/rabbitmq.pid"
	# Keep Erlang distribution (node-to-CLI traffic) on loopback as well.
	export RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
	export RABBITMQ_CTL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
	export ERL_EPMD_ADDRESS=127.0.0.1
	unset RABBITMQ_ENV_LOADED
}

# rmq_ctl DIR NODENAME AMQP_PORT DIST_PORT ARGS...: rabbitmqctl against the node.
rmq_ctl() {
	(
		rmq_env "$1" "$2" "$3" "$4"
		local node="$2"
		shift 4
		"${RABBITMQ_LIBEXEC}/rabbitmqctl" -n "$node" "$@"
	)
}

# rmq_vm_pid DIR: prints the pid of the node's Erlang VM if it runs. Checks
# that the process really is this node (a stale pid file may point at an
# unrelated process after a reboot).
rmq_vm_pid() {
	local dir="$1" pid wpid
	pid="$(read_pid "$dir/rabbitmq.pid")"
	if [[ -z "$pid" ]]; then
		# Very early in boot RabbitMQ has not written its pid file yet: the VM
		# is then the wrapper's child.
		wpid="$(read_pid "$dir/wrapper.pid")"
		[[ -n "$wpid" ]] && alive "$wpid" && pid="$(pgrep -P "$wpid" -x beam.smp | head -n1 || true)"
	fi
	[[ -n "$pid" ]] && alive "$pid" || return 1
	tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qxF "RABBITMQ_MNESIA_BASE=$dir/mnesia" || return 1
	printf '%s\n' "$pid"
}

# rmq_show_logs DIR NODENAME: the end of the node's logs, for error reports.
rmq_show_logs() {
	local dir="$1" node="$2"
	if [[ -s "$dir/stdout.log" ]]; then
		# Only this start's output: it begins at our last "====" marker.
		log "---- server output ($dir/stdout.log) ----"
		awk '/^==== /{buf=""} {buf=buf $0 "\n"} END{printf "%s", buf}' "$dir/stdout.log" | tail -n 60 >&2
	fi
	if [[ -s "$dir/log/${node}.log" ]]; then
		log "---- last lines of $dir/log/${node}.log ----"
		tail -n 30 "$dir/log/${node}.log" >&2
	fi
}

# rmq_start DIR NODENAME AMQP_PORT DIST_PORT: starts the node in the
# background and waits until it accepts AMQP connections and has fully booted.
# Returns 0 at once if this node already runs.
rmq_start() {
	local dir="$1" node="$2" port="$3" dist="$4" t0 deadline wpid pid
	t0="$(now_ms)"
	if pid="$(rmq_vm_pid "$dir")"; then
		if amqp_answers "$port"; then
			log "RabbitMQ node $node already running (pid $pid, port $port)"
			return 0
		fi
		# Booting (or stopping): wait for it below instead of starting another.
		log "RabbitMQ node $node is already starting (pid $pid); waiting"
	else
		if port_open "$port"; then
			die "port $port is already in use by another process; cannot start RabbitMQ node $node there"
		fi
		if port_open "$dist"; then
			die "Erlang distribution port $dist (for node $node) is already in use; pick another AMQP port"
		fi
		ensure_epmd
		rmq_prepare "$dir"
		rm -f "$dir/rabbitmq.pid" "$dir/wrapper.pid"
		{
			printf '\n==== %s starting %s (amqp %s, dist %s)\n' "$(date '+%F %T')" "$node" "$port" "$dist"
		} >>"$dir/stdout.log"
		(
			rmq_env "$dir" "$node" "$port" "$dist"
			cd "$dir" || exit 1
			# setsid + no inherited stdio: the node must outlive this script
			# and must not hold the caller's pipes open.
			setsid "${RABBITMQ_LIBEXEC}/rabbitmq-server" </dev/null >>"$dir/stdout.log" 2>&1 &
			echo $! >"$dir/wrapper.pid"
		)
	fi
	wpid="$(read_pid "$dir/wrapper.pid")"
	deadline=$(($(date +%s) + DELAYD_START_TIMEOUT))
	until amqp_answers "$port"; do
		if ! rmq_vm_pid "$dir" >/dev/null && ! { [[ -n "$wpid" ]] && alive "$wpid"; }; then
			rmq_show_logs "$dir" "$node"
			die "RabbitMQ node $node exited during startup (logs above; state in $dir)"
		fi
		if (($(date +%s) >= deadline)); then
			rmq_show_logs "$dir" "$node"
			# Leave no half-started node behind to confuse the next attempt.
			rmq_kill "$dir" "$node" "$port" || true
			die "RabbitMQ node $node did not accept AMQP connections on 127.0.0.1:$port within ${DELAYD_START_TIMEOUT}s"
		fi
		sleep 0.2
	done
	# The listener opens near the end of boot; await_startup confirms that
	# boot has completed (default user and vhost exist, queues recovered).
	local out
	if ! out="$(rmq_ctl "$dir" "$node" "$port" "$dist" -q await_startup --timeout "$DELAYD_START_TIMEOUT" 2>&1)"; then
		printf '%s\n' "$out" >&2
		rmq_show_logs "$dir" "$node"
		die "RabbitMQ node $node: rabbitmqctl await_startup failed"
	fi
	log "RabbitMQ node $node ready on 127.0.0.1:$port (pid $(rmq_vm_pid "$dir" || echo '?'), $(($(now_ms) - t0)) ms)"
}

# rmq_wait_gone DIR PORT PID SECONDS: waits until the VM exited and the AMQP
# port no longer accepts connections.
rmq_wait_gone() {
	local dir="$1" port="$2" pid="$3" deadline
	deadline=$(($(date +%s) + $4))
	while alive "$pid" || port_open "$port"; do
		(($(date +%s) >= deadline)) && return 1
		sleep 0.1
	done
	return 0
}

# rmq_stop DIR NODENAME AMQP_PORT: graceful stop. SIGTERM makes RabbitMQ shut
# down cleanly (as `rabbitmqctl stop` does) without needing the CLI; after 60s
# it is killed.
rmq_stop() {
	local dir="$1" node="$2" port="$3" pid t0
	t0="$(now_ms)"
	if ! pid="$(rmq_vm_pid "$dir")"; then
		log "RabbitMQ node $node is not running"
		rm -f "$dir/rabbitmq.pid" "$dir/wrapper.pid"
		return 0
	fi
	kill -TERM "$pid" 2>/dev/null || true
	if ! rmq_wait_gone "$dir" "$port" "$pid" 60; then
		log "RabbitMQ node $node did not stop within 60s; killing it"
		kill -KILL "$pid" 2>/dev/null || true
		rmq_wait_gone "$dir" "$port" "$pid" 10 || die "RabbitMQ node $node (pid $pid) would not die"
	fi
	rm -f "$dir/rabbitmq.pid" "$dir/wrapper.pid"
	log "RabbitMQ node $node stopped ($(($(now_ms) - t0)) ms)"
}

# rmq_kill DIR NODENAME AMQP_PORT: SIGKILL the Erlang VM (a crash, for fault
# tests). Durable state on disk survives; the next start recovers it.
rmq_kill() {
	local dir="$1" node="$2" port="$3" pid
	if ! pid="$(rmq_vm_pid "$dir")"; then
		log "RabbitMQ node $node is not running"
		return 0
	fi
	kill -KILL "$pid" 2>/dev/null || true
	rmq_wait_gone "$dir" "$port" "$pid" 10 || die "RabbitMQ node $node (pid $pid) still there after SIGKILL"
	rm -f "$dir/wrapper.pid"
	log "RabbitMQ node $node killed (pid $pid)"
}

# ensure_venv: prints the python of <repo>/.local/venv, a virtualenv with pika
# (the demo consumer's only dependency), so the system Python stays clean.
ensure_venv() {
	local venv="$DELAYD_LOCAL_DIR/venv" py
	if "$venv/bin/python" -c 'import pika' >/dev/null 2>&1; then
		printf '%s\n' "$venv/bin/python"
		return 0
	fi
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
	printf '%s\n' "$venv/bin/python"
}

# rmq_test_node_pids: pids of running private test nodes (rabbitmq-node.sh,
# node names delayd-test-*), recognised by their environment.
rmq_test_node_pids() {
	local pid
	for pid in $(pgrep -x beam.smp || true); do
		if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -q '^RABBITMQ_NODENAME=delayd-test-'; then
			printf '%s\n' "$pid"
		fi
	done
}

# --- private Redis servers --------------------------------------------------
# redis-cluster.sh and redis-sentinel.sh keep each server's state under
# DIR/PORT and its pid in DIR/PORT.pid.

# ensure_redis: redis-server and redis-cli, installed when missing.
ensure_redis() {
	if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
		ensure_packages
	fi
}

# redis_cli PORT ARGS...: redis-cli against 127.0.0.1:PORT, never longer than 5s.
redis_cli() { timeout 5 redis-cli -h 127.0.0.1 -p "$1" "${@:2}"; }

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

# kill_pidfiles DIR: SIGKILL every server with a pid file in DIR.
kill_pidfiles() {
	local f pid
	for f in "$1"/*.pid; do
		[[ -e "$f" ]] || continue
		pid="$(read_pid "$f")"
		if [[ -n "$pid" ]]; then
			kill -KILL "$pid" 2>/dev/null || true
		fi
		rm -f "$f"
	done
}

# kill_pidfile DIR PORT: SIGKILL the server on PORT, as a crash.
kill_pidfile() {
	local pid
	pid="$(read_pid "$1/$2.pid")"
	[[ -n "$pid" ]] || die "no node on port $2 in $1"
	kill -KILL "$pid"
	rm -f "$1/$2.pid"
}

# watch_pidfiles PID DIR: a detached watcher that kills DIR's servers once
# process PID has exited (a test binary has no global teardown, so it passes
# its own pid). It outlives the caller and ends with the servers.
watch_pidfiles() {
	# shellcheck disable=SC2016 # expanded by the inner bash
	setsid bash -c '
		while kill -0 "$1" 2>/dev/null; do sleep 0.5; done
		for f in "$2"/*.pid; do [[ -e "$f" ]] && kill -KILL "$(cat "$f")" 2>/dev/null; rm -f "$f"; done
	' _ "$1" "$2" </dev/null >/dev/null 2>&1 &
}

# redis_test_node_pids: pids of running private test Redis servers (cluster
# and sentinel nodes from redis-cluster.sh / redis-sentinel.sh, the TLS
# tests' servers), recognised by the DELAYD_TEST_REDIS_NODE marker in their
# environment.
redis_test_node_pids() {
	local pid
	for pid in $(pgrep -x redis-server || true) $(pgrep -x redis-sentinel || true); do
		if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -q '^DELAYD_TEST_REDIS_NODE=1'; then
			printf '%s\n' "$pid"
		fi
	done
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
