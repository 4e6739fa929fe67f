#!/usr/bin/env bash
# Debian 13 (trixie)'s RabbitMQ 4.0, Redis 8.0 and Valkey 8.1 on this machine,
# without touching the system: a minimal trixie tree in <repo>/.local/trixie,
# built once (about 80 s, 400 MB; needs root) and reused while it exists.
#
#   deploy/local/trixie.sh build                 build the tree unless it is there
#   deploy/local/trixie.sh exec PROGRAM ARGS...  run the tree's PROGRAM (its pid stays this one)
#
# `exec` runs PROGRAM under chroot in a mount namespace of its own, into which
# /proc, /dev, /sys, /tmp (and TMPDIR) and the repository are bound at the
# same paths, so a server's data, config and certificate paths mean the same
# inside as outside. The mounts end with the process; nothing is mounted on
# the system. The server sets in deploy/local/lib.sh (DELAYD_SERVERS) put
# deploy/local/trixie-bin, whose commands come here, first on PATH.
set -euo pipefail

LOG_TAG=trixie
# shellcheck source=deploy/local/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

TREE="$DELAYD_LOCAL_DIR/trixie"
# Written last: a tree without it is an interrupted build.
READY="$TREE/.delayd-ready"

build() {
	[[ -e "$READY" ]] && return 0
	[[ "$(id -u)" == 0 ]] || die "building $TREE (debootstrap, chroot) needs root"
	mkdir -p "$DELAYD_LOCAL_DIR"
	# One build at a time: servers.sh and test binaries may ask together.
	exec 8>"$DELAYD_LOCAL_DIR/trixie.lock"
	flock 8
	[[ -e "$READY" ]] && return 0
	command -v debootstrap >/dev/null 2>&1 || apt_install debootstrap
	local partial="$TREE.partial" t0
	t0="$(now_ms)"
	# --one-file-system: an interrupted debootstrap may leave /proc mounted there.
	rm -rf --one-file-system "$partial" "$TREE"
	log "building $TREE: debootstrap trixie with rabbitmq-server, redis-server, valkey-server (about 80 s)"
	if ! debootstrap --variant=minbase --include=rabbitmq-server,redis-server,valkey-server \
		trixie "$partial" "${DELAYD_DEBIAN_MIRROR:-http://deb.debian.org/debian}" \
		>"$DELAYD_LOCAL_DIR/trixie-build.log" 2>&1; then
		tail -n 20 "$DELAYD_LOCAL_DIR/trixie-build.log" >&2
		die "debootstrap failed (log: $DELAYD_LOCAL_DIR/trixie-build.log)"
	fi
	# RabbitMQ's node names are NAME@localhost.
	printf '127.0.0.1 localhost\n::1 localhost ip6-localhost\n' >"$partial/etc/hosts"
	mv "$partial" "$TREE"
	{
		printf 'built %s\n' "$(date -u '+%F %T')"
		chroot "$TREE" dpkg-query -W rabbitmq-server redis-server valkey-server erlang-base
	} >"$READY"
	log "built $TREE in $((($(now_ms) - t0) / 1000)) s: $(tail -n +2 "$READY" | tr '\t\n' '  ')"
}


in_tree() {
	local prog="$1"
	shift
	[[ -e "$READY" ]] || build >&2
	# The mounts below live in this namespace only; private, so none
	# propagates back to the system.
	# shellcheck disable=SC2016 # expanded by the inner shells
	exec unshare --mount --propagation private -- bash -c '
		set -e
		tree="$1" prog="$2" repo="$3"
		shift 3
		for d in /proc /dev /sys /tmp "${TMPDIR:-/tmp}" "$repo"; do
			[[ -d "$d" ]] || continue
			mkdir -p "$tree$d"
			mount --rbind "$d" "$tree$d"
		done
		# The caller'"'"'s working directory where it is visible, else /.
		exec chroot "$tree" /bin/sh -c "cd \"\$0\" 2>/dev/null || cd /; exec \"\$@\"" "$PWD" "$prog" "$@"
	' trixie-exec "$TREE" "$prog" "$DELAYD_REPO_ROOT" "$@"
}

case "${1:-}" in
build)
	(($# == 1)) || usage
	build
	;;
exec)
	(($# >= 2)) || usage
	shift
	in_tree "$@"
	;;
*) usage ;;
esac
