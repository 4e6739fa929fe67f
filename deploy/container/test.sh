#!/usr/bin/env bash
# The container test: builds the delayd image from deploy/Dockerfile with
# Podman and runs it the way the README tells users to, beside the local Redis
# and RabbitMQ (host network), with the config mounted at
# /etc/delayd/delayd.toml and the server URLs and listen address given as
# DELAYD_* environment overrides. It checks that
#   1. /readyz turns 200;
#   2. the daemon runs as uid and gid 10001;
#   3. members scheduled with `redis-cli ZADD` arrive at a queue, each once;
#   4. `podman stop` (SIGTERM) in the middle of a burst gives exit code 0, no
#      member left in flight, and every member either delivered once or back
#      in its key (none lost, none twice);
#   5. the AMQP password never reaches the logs;
#   6. a bad config makes the container exit 2 with one line in `podman logs`
#      that names the file and the field;
# and prints the image size and the build time. The image is built once and
# every check runs against it.
#
#   deploy/container/test.sh        (deploy/local/test.sh runs it too)
#   deploy/container/test.sh --build-only   (the image and its base images,
#                                            no check: deploy/local/test.sh
#                                            builds so at low priority while
#                                            the tests run)
#
# No registry is needed. Unless DELAYD_BUILDER_IMAGE and DELAYD_RUNTIME_IMAGE
# name the base images to use (e.g. the public rust:1-bookworm and
# debian:bookworm-slim on a machine that can pull them), it makes local
# stand-ins once and keeps them in Podman's image store:
#   localhost/delayd-standin/debian:bookworm-slim  mmdebstrap --variant=minbase
#   localhost/delayd-standin/rust:<rustc>-bookworm the above + gcc + the Rust
#                                                  toolchain of this machine
# DELAYD_IMAGE names the tag to build (default delayd:local, as in
# docker-compose.yml). Podman's settings for this machine are detected, not
# assumed (see detect_podman below and docs/container.md).
set -euo pipefail

LOG_TAG="container"
BUILD_ONLY=0
case "${1:-}" in
"") ;;
--build-only) BUILD_ONLY=1 ;;
*)
	grep -E '^#   deploy/container/test\.sh ' "$0" | sed 's/^#   //' >&2
	exit 2
	;;
esac
# shellcheck source=deploy/local/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../local/lib.sh"
cd "$DELAYD_REPO_ROOT"

IMAGE="${DELAYD_IMAGE:-delayd:local}"
SUITE="bookworm"
STANDIN_DEBIAN="localhost/delayd-standin/debian:${SUITE}-slim"
WORK_DIR="$DELAYD_LOCAL_DIR/container"
# The daemon's own uid/gid in the image (deploy/Dockerfile, USER).
IMAGE_UID=10001
# Ports of our own, for the daemon's HTTP listener on the host network,
# below the kernel's ephemeral range (32768 up): a port there that nothing
# listens on can still be taken by an outgoing connection of the tests
# running beside, and the daemon then exits "Address already in use" (a
# bare run at 800b8a6's successor, on port 45316).
PORT_RANGE_LO=24000
PORT_RANGE_HI=25000

# --- prerequisites -------------------------------------------------------------

# ensure_container_tools: podman, runc (crun, podman's first choice, refuses
# hybrid cgroup hierarchies), mmdebstrap for the stand-in root filesystem, and
# the Redis/RabbitMQ packages for the servers and redis-cli.
ensure_container_tools() {
	local missing=()
	command -v podman >/dev/null 2>&1 || missing+=(podman)
	command -v runc >/dev/null 2>&1 || missing+=(runc)
	command -v mmdebstrap >/dev/null 2>&1 || missing+=(mmdebstrap)
	((${#missing[@]} == 0)) || apt_install "${missing[@]}"
	ensure_packages
}

# --- podman settings -------------------------------------------------------------
# PODMAN holds the command with the global flags this machine needs; a
# project-local containers.conf (CONTAINERS_CONF) carries the rlimits.
PODMAN=(podman)

# detect_podman IMAGE: runs `true` in IMAGE and adapts to what fails:
#  * "error setting rlimit": podman asks for nofile/nproc limits above the
#    hard limits here, and without CAP_SYS_RESOURCE nothing may raise one; a
#    containers.conf sets default_ulimits to this shell's hard limits, and
#    the nproc limit is halved until the runtime accepts it;
#  * any other failure with a runtime other than runc (crun: "cgroups in
#    hybrid mode not supported"): use runc.
# Without systemd as init, podman's systemd cgroup manager cannot work, so
# cgroupfs is asked for explicitly.
detect_podman() {
	local img="$1" out conf nofile nproc tries
	if [[ ! -d /run/systemd/system ]]; then
		PODMAN+=(--cgroup-manager cgroupfs)
	fi
	nofile="$(ulimit -Hn)"
	nproc="$(ulimit -Hu)"
	[[ "$nofile" == unlimited ]] && nofile=1048576
	[[ "$nproc" == unlimited ]] && nproc=4194304
	for ((tries = 0; tries < 12; tries++)); do
		if out="$("${PODMAN[@]}" run --rm --network host "$img" true 2>&1)"; then
			log "podman: ${PODMAN[*]}${CONTAINERS_CONF:+ with CONTAINERS_CONF=$CONTAINERS_CONF}"
			return 0
		fi
		if [[ "$out" == *"error setting rlimit"* || "$out" == *"setrlimit"* ]]; then
			if [[ -n "${CONTAINERS_CONF:-}" && "$CONTAINERS_CONF" != "$WORK_DIR/containers.conf" ]]; then
				die "podman cannot set the rlimits in your CONTAINERS_CONF ($CONTAINERS_CONF): $out"
			fi
			if [[ -n "${CONTAINERS_CONF:-}" ]]; then
				# Ours already: the runtime accepts less nproc than the shell has.
				nproc=$((nproc / 2))
				((nproc >= 1024)) || die "podman cannot set any nproc limit: $out"
			fi
			conf="$WORK_DIR/containers.conf"
			mkdir -p "$WORK_DIR"
			cat >"$conf" <<-EOF
				# Written by deploy/container/test.sh: podman's default rlimits are above
				# this machine's hard limits, which nothing here may raise.
				[containers]
				default_ulimits = ["nofile=${nofile}:${nofile}", "nproc=${nproc}:${nproc}"]
			EOF
			export CONTAINERS_CONF="$conf"
			log "podman: rlimits refused; trying default_ulimits nofile=$nofile nproc=$nproc ($conf)"
			continue
		fi
		if [[ " ${PODMAN[*]} " != *" --runtime runc "* ]] && command -v runc >/dev/null 2>&1; then
			log "podman: the default runtime failed ($(tail -n1 <<<"$out")); trying runc"
			PODMAN+=(--runtime runc)
			continue
		fi
		die "podman cannot run a container here: $out"
	done
	die "podman cannot run a container here: $out"
}

# --- base images -------------------------------------------------------------------

image_exists() { "${PODMAN[@]}" image exists "$1"; }

# ensure_standin_debian: a Debian root filesystem from mmdebstrap, imported as
# an image. Documentation and locales are left out as in debian:*-slim, so the
# reported image size is close to the real one.
ensure_standin_debian() {
	image_exists "$STANDIN_DEBIAN" && return 0
	local t0 tar sources=()
	t0="$(now_ms)"
	mkdir -p "$WORK_DIR"
	tar="$WORK_DIR/debian-${SUITE}.tar"
	# The machine's own Debian sources (its mirror or proxy) when it runs the
	# same suite; otherwise mmdebstrap's default mirror.
	if [[ -r /etc/apt/sources.list.d/debian.sources ]] && grep -qw "$SUITE" /etc/apt/sources.list.d/debian.sources; then
		sources=(/etc/apt/sources.list.d/debian.sources)
	fi
	# As in Debian's own container images: apt keeps no package caches, so
	# an `apt-get install` layer holds only what it installed.
	cat >"$WORK_DIR/docker-clean" <<-'EOF'
		DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
		APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
		Dir::Cache::pkgcache "";
		Dir::Cache::srcpkgcache "";
	EOF
	log "building $STANDIN_DEBIAN with mmdebstrap (once per machine)"
	# shellcheck disable=SC2016 # "$1" is for the hook's shell (the root dir)
	mmdebstrap --variant=minbase --quiet \
		--dpkgopt='path-exclude=/usr/share/man/*' \
		--dpkgopt='path-exclude=/usr/share/locale/*' \
		--dpkgopt='path-exclude=/usr/share/doc/*' \
		--dpkgopt='path-include=/usr/share/doc/*/copyright' \
		--customize-hook="copy-in $WORK_DIR/docker-clean /etc/apt/apt.conf.d" \
		--customize-hook='find "$1/var/cache/apt" -type f -delete' \
		"$SUITE" "$tar" "${sources[@]}" >&2 || die "mmdebstrap failed"
	rm -f "$WORK_DIR/docker-clean"
	"${PODMAN[@]}" import --change 'CMD ["/bin/bash"]' "$tar" "$STANDIN_DEBIAN" >/dev/null ||
		die "podman import of $tar failed"
	rm -f "$tar"
	log "$STANDIN_DEBIAN ready ($(($(now_ms) - t0)) ms)"
}

# ensure_standin_rust: the Debian stand-in plus gcc and this machine's Rust
# toolchain (deploy/container/builder.Containerfile). Tagged by rustc version.
ensure_standin_rust() {
	local sysroot version ctx t0
	command -v rustc >/dev/null 2>&1 || die "rustc not found on PATH (install Rust with rustup first)"
	sysroot="$(rustc --print sysroot)"
	version="$(rustc -V | awk '{print $2}')"
	STANDIN_RUST="localhost/delayd-standin/rust:${version}-${SUITE}"
	image_exists "$STANDIN_RUST" && return 0
	t0="$(now_ms)"
	ctx="$WORK_DIR/builder-context"
	rm -rf "$ctx"
	mkdir -p "$ctx/ca"
	# Local CAs the machine trusts (e.g. a TLS-inspecting egress proxy).
	if compgen -G '/usr/local/share/ca-certificates/*.crt' >/dev/null; then
		cp /usr/local/share/ca-certificates/*.crt "$ctx/ca/"
	fi
	log "building $STANDIN_RUST from $sysroot (once per toolchain)"
	"${PODMAN[@]}" build --isolation chroot --format docker \
		-f deploy/container/builder.Containerfile \
		--build-arg "BASE_IMAGE=$STANDIN_DEBIAN" \
		-v "$sysroot:/host-rust:ro" \
		-t "$STANDIN_RUST" "$ctx" >&2 || die "building $STANDIN_RUST failed"
	rm -rf "$ctx"
	log "$STANDIN_RUST ready ($(($(now_ms) - t0)) ms)"
}

# --- helpers for the checks ------------------------------------------------------

# http_status PORT PATH: the status code of GET PATH on 127.0.0.1:PORT, or 000.
http_status() {
	local code
	# shellcheck disable=SC2016 # expanded by the inner bash
	code="$(timeout 3 bash -c '
		exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
		printf "GET %s HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n" "$2" >&3
		head -n 1 <&3
	' _ "$1" "$2" 2>/dev/null | awk '{print $2}')" || true
	printf '%s\n' "${code:-000}"
}

# pick_port: a port in our range with nothing listening on it.
pick_port() {
	local p i
	for ((i = 0; i < 200; i++)); do
		p=$((PORT_RANGE_LO + RANDOM % (PORT_RANGE_HI - PORT_RANGE_LO)))
		port_open "$p" || {
			printf '%s\n' "$p"
			return 0
		}
	done
	die "no free port in $PORT_RANGE_LO-$PORT_RANGE_HI"
}

rcli() { redis-cli -u "$DELAYD_TEST_REDIS_URL" "$@"; }

redis_ms() { rcli TIME | awk 'NR==1{s=$1} NR==2{printf "%d\n", s*1000 + int($1/1000)}'; }

container_state() { "${PODMAN[@]}" inspect --format "{{.State.$2}}" "$1" 2>/dev/null; }

# fail MESSAGE: one check failed; the logs of the daemon follow.
fail() {
	log "FAILED: $*"
	if [[ -n "${CURRENT:-}" ]]; then
		log "---- podman logs $CURRENT ----"
		"${PODMAN[@]}" logs "$CURRENT" 2>&1 | tail -n 40 >&2 || true
	fi
	exit 1
}

pass() { log "ok: $*"; }

# --- main --------------------------------------------------------------------------

ensure_container_tools

# Standalone runs bring the servers up (and down again); under
# deploy/local/test.sh they run already and the URLs are set.
to_stop=()
if ((!BUILD_ONLY)) && [[ -z "${DELAYD_TEST_REDIS_URL:-}" || -z "${DELAYD_TEST_AMQP_URL:-}" ]]; then
	note_servers_to_stop
	"$DELAYD_REPO_ROOT/deploy/local/servers.sh" start
	eval "$("$DELAYD_REPO_ROOT/deploy/local/servers.sh" env)"
fi
if ((!BUILD_ONLY)); then
	PY="$(ensure_venv)"
	export DELAYD_TEST_AMQP_URL
fi

ID="$(head -c 6 /dev/urandom | od -An -tx1 | tr -d ' \n')"
NAME="delayd-ct-$ID"
KEY="delayd-ct:$ID"
EXCHANGE="delayd-ct-$ID"
QUEUE="delayd-ct-$ID"
ROUTING_KEY="ct.$ID"
RUN_DIR="$WORK_DIR/run-$ID"
CURRENT=""

cleanup() {
	local rc=$? c
	# A build alone starts no container and touches no server.
	((!BUILD_ONLY)) || exit "$rc"
	for c in "$NAME" "$NAME-bad"; do
		"${PODMAN[@]}" rm -f -t 0 "$c" >/dev/null 2>&1 || true
	done
	"$PY" deploy/container/amqp.py delete "$EXCHANGE" "$QUEUE" >/dev/null 2>&1 || true
	{
		printf '%s\n' "$KEY"
		rcli --scan --pattern "{$KEY}:*" 2>/dev/null
	} | xargs -r redis-cli -u "$DELAYD_TEST_REDIS_URL" DEL >/dev/null 2>&1 || true
	rm -rf "$RUN_DIR"
	stop_noted_servers
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Base images, then what this machine needs to run a container.
builder_image="${DELAYD_BUILDER_IMAGE:-}"
runtime_image="${DELAYD_RUNTIME_IMAGE:-}"
if [[ -z "$runtime_image" || -z "$builder_image" ]]; then
	ensure_standin_debian
fi
detect_podman "${runtime_image:-$STANDIN_DEBIAN}"
if [[ -z "$builder_image" ]]; then
	ensure_standin_rust
	builder_image="$STANDIN_RUST"
fi
runtime_image="${runtime_image:-$STANDIN_DEBIAN}"

# The image: built once, every check below uses it. Layers and the
# Dockerfile's cargo target cache mount make a rebuild cheap.
log "building $IMAGE (builder $builder_image, runtime $runtime_image)"
t0="$(now_ms)"
"${PODMAN[@]}" build --isolation chroot --format docker \
	-f deploy/Dockerfile \
	--build-arg "BUILDER_IMAGE=$builder_image" \
	--build-arg "RUNTIME_IMAGE=$runtime_image" \
	-t "$IMAGE" . >"$WORK_DIR/build.log" 2>&1 || {
	tail -n 40 "$WORK_DIR/build.log" >&2
	die "podman build failed (whole log: $WORK_DIR/build.log)"
}
build_ms=$(($(now_ms) - t0))
size="$("${PODMAN[@]}" image inspect --format '{{.Size}}' "$IMAGE")"
base_size="$("${PODMAN[@]}" image inspect --format '{{.Size}}' "$runtime_image")"
log "image $IMAGE: $((size / 1000000)) MB ($(((size - base_size) / 1000000)) MB on top of its base $runtime_image, $((base_size / 1000000)) MB); built in $((build_ms / 1000)).$(((build_ms % 1000) / 100)) s"
((!BUILD_ONLY)) || exit 0

# The config a user mounts: placeholders for what the environment overrides.
mkdir -p "$RUN_DIR"
chmod 755 "$RUN_DIR"
PORT="$(pick_port)"
cat >"$RUN_DIR/delayd.toml" <<EOF
# Written by deploy/container/test.sh. The URLs and the listen address are
# placeholders: DELAYD_* environment variables override them, as in a real
# deployment.
[redis]
url = "redis://redis.invalid:6379/0"

[amqp]
url = "amqp://rabbitmq.invalid:5672/%2f"

[http]
listen = "0.0.0.0:9464"
open_reads = true

[log]
format = "json"

[businesses.container_test]
key = "$KEY"
exchange = "$EXCHANGE"
routing_key = "$ROUTING_KEY"
shutdown_timeout = "10s"
EOF
chmod 644 "$RUN_DIR/delayd.toml"
"$PY" deploy/container/amqp.py declare "$EXCHANGE" "$QUEUE" "$ROUTING_KEY"

# As docker-compose.yml and the Kubernetes manifest run it: the image's own
# command, a read-only root filesystem, no capabilities.
run_args=(
	--network host
	--read-only --cap-drop ALL --security-opt no-new-privileges
	-v "$RUN_DIR/delayd.toml:/etc/delayd/delayd.toml:ro"
	-e "DELAYD_REDIS__URL=$DELAYD_TEST_REDIS_URL"
	-e "DELAYD_AMQP__URL=$DELAYD_TEST_AMQP_URL"
	-e "DELAYD_HTTP__LISTEN=127.0.0.1:$PORT"
)
CURRENT="$NAME"
"${PODMAN[@]}" run -d --name "$NAME" "${run_args[@]}" "$IMAGE" >/dev/null || fail "podman run failed"

# 1. /readyz turns 200.
t0="$(now_ms)"
until [[ "$(http_status "$PORT" /readyz)" == 200 ]]; do
	[[ "$(container_state "$NAME" Running)" == true ]] || fail "the container exited (code $(container_state "$NAME" ExitCode)) before /readyz answered 200"
	(($(now_ms) - t0 < 60000)) || fail "/readyz did not answer 200 within 60 s (last: $(http_status "$PORT" /readyz))"
	sleep 0.2
done
pass "/readyz answered 200 after $(($(now_ms) - t0)) ms"

# 2. The daemon's process (PID 1 of the container) runs as uid/gid 10001.
pid="$(container_state "$NAME" Pid)"
uids="$(awk '/^Uid:/{print $2, $3, $4, $5}' "/proc/$pid/status")"
gids="$(awk '/^Gid:/{print $2, $3, $4, $5}' "/proc/$pid/status")"
comm="$(cat "/proc/$pid/comm")"
want="$IMAGE_UID $IMAGE_UID $IMAGE_UID $IMAGE_UID"
[[ "$comm" == delayd && "$uids" == "$want" && "$gids" == "$want" ]] ||
	fail "process $pid ($comm) runs with uids '$uids' and gids '$gids', expected $IMAGE_UID"
pass "the daemon ($comm, host pid $pid) runs as uid $IMAGE_UID, gid $IMAGE_UID"

# 3. Members scheduled with redis-cli arrive, each once: 20 due now, 10 in 1.5 s.
now="$(redis_ms)"
args=()
expected=()
for i in $(seq 1 20); do
	args+=("$now" "now-$i-$ID")
	expected+=("now-$i-$ID")
done
for i in $(seq 1 10); do
	args+=("$((now + 1500))" "later-$i-$ID")
	expected+=("later-$i-$ID")
done
rcli ZADD "$KEY" "${args[@]}" >/dev/null
got="$("$PY" deploy/container/amqp.py drain "$QUEUE" --expect 30 --timeout 30 | sort)"
want_sorted="$(printf '%s\n' "${expected[@]}" | sort)"
[[ "$got" == "$want_sorted" ]] ||
	fail "the queue got $(grep -c . <<<"$got") messages, expected these 30 once each: $(diff <(printf '%s\n' "$want_sorted") <(printf '%s\n' "$got") | tr '\n' ' ')"
pass "30 members ZADDed with redis-cli arrived at queue $QUEUE, each once"

# 4. SIGTERM in the middle of a burst: 20000 members due now, stop at once.
BURST=20000
now="$(redis_ms)"
seq -f "burst-%06g-$ID" 1 "$BURST" >"$RUN_DIR/burst"
# One ZADD, so the whole burst is due at once and the daemon is busy with it.
mapfile -t args < <(awk -v now="$now" '{print now; print $0}' "$RUN_DIR/burst")
rcli ZADD "$KEY" "${args[@]}" >/dev/null
t0="$(now_ms)"
"${PODMAN[@]}" stop -t 30 "$NAME" >/dev/null || fail "podman stop failed"
stop_ms=$(($(now_ms) - t0))
code="$(container_state "$NAME" ExitCode)"
[[ "$code" == 0 ]] || fail "podman stop: exit code $code, expected 0"
inflight="$(rcli ZCARD "{$KEY}:inflight")"
dead="$(rcli ZCARD "{$KEY}:dead")"
[[ "$inflight" == 0 && "$dead" == 0 ]] || fail "after the stop: $inflight members in flight and $dead dead, expected none"
"$PY" deploy/container/amqp.py drain "$QUEUE" --expect 0 --timeout 30 | sort >"$RUN_DIR/delivered"
rcli ZRANGE "$KEY" 0 -1 | sort >"$RUN_DIR/pending"
sort "$RUN_DIR/burst" >"$RUN_DIR/burst.sorted"
delivered="$(grep -c . "$RUN_DIR/delivered" || true)"
pending="$(grep -c . "$RUN_DIR/pending" || true)"
dups="$(sort "$RUN_DIR/delivered" "$RUN_DIR/pending" | uniq -d | head -n 3 | tr '\n' ' ')"
[[ -z "$dups" ]] || fail "delivered twice, or delivered and still pending: $dups"
sort -m "$RUN_DIR/delivered" "$RUN_DIR/pending" | cmp -s - "$RUN_DIR/burst.sorted" ||
	fail "delivered ($delivered) + pending ($pending) is not the burst of $BURST members"
pass "podman stop (SIGTERM) mid-burst: exit 0 after $stop_ms ms; of $BURST members $delivered delivered once, $pending back in $KEY, 0 in flight, none lost"

# 5. The AMQP URL (with its password) never reached the logs.
logs="$("${PODMAN[@]}" logs "$NAME" 2>&1)"
if [[ "$DELAYD_TEST_AMQP_URL" == *:*@* ]] && grep -qF "$DELAYD_TEST_AMQP_URL" <<<"$logs"; then
	fail "the AMQP URL with its password appears in podman logs"
fi
"${PODMAN[@]}" rm "$NAME" >/dev/null

# 6. A bad config: exit 2 and one line naming the file and the field.
sed 's/^shutdown_timeout = .*/shutdown_timeout = "soon"/' "$RUN_DIR/delayd.toml" >"$RUN_DIR/bad.toml"
chmod 644 "$RUN_DIR/bad.toml"
CURRENT="$NAME-bad"
bad_args=()
for a in "${run_args[@]}"; do
	bad_args+=("${a/"$RUN_DIR/delayd.toml"/"$RUN_DIR/bad.toml"}")
done
"${PODMAN[@]}" run --name "$NAME-bad" "${bad_args[@]}" "$IMAGE" >/dev/null 2>&1 || true
code="$(container_state "$NAME-bad" ExitCode)"
logs="$("${PODMAN[@]}" logs "$NAME-bad" 2>&1)"
lines="$(grep -c . <<<"$logs" || true)"
[[ "$code" == 2 ]] || fail "a bad config: exit code $code, expected 2"
[[ "$lines" == 1 && "$logs" == *"/etc/delayd/delayd.toml"* && "$logs" == *container_test* && "$logs" == *shutdown_timeout* ]] ||
	fail "a bad config: expected one line naming the file, business and field; podman logs has $lines: $logs"
pass "a bad config: exit 2, podman logs: $logs"
CURRENT=""

log "all container checks passed (image $IMAGE, $((size / 1000000)) MB, built in $((build_ms / 1000)) s)"
