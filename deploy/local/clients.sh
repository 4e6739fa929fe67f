#!/usr/bin/env bash
# The Redis client libraries the producer examples (examples/) and the
# snippets in docs/id-mode.md use, installed on first use into
# <repo>/.local (pip, npm) or from Debian (ruby, php), so a fresh CI machine
# gets them too. The tests run the examples and snippets with them.
#
#   deploy/local/clients.sh python   prints a python with redis-py, pika and opentelemetry-sdk
#   deploy/local/clients.sh node     prints a NODE_PATH holding ioredis
#   deploy/local/clients.sh ruby     prints a ruby that can `require "redis"`
#   deploy/local/clients.sh php      prints a php with the redis extension
#   deploy/local/clients.sh all      installs all four, prints nothing
#
# One install at a time (a lock under .local): test binaries ask at once, and
# apt-get allows one dpkg at a time.
set -euo pipefail

LOG_TAG="clients"
# shellcheck source=deploy/local/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

python_client() {
	local py
	py="$(ensure_venv)"
	if ! "$py" -c 'import redis, opentelemetry.sdk' >/dev/null 2>&1; then
		log "installing redis-py and opentelemetry-sdk into $(dirname "$(dirname "$py")")"
		"$py" -m pip install -q --disable-pip-version-check 'redis>=5,<6' 'opentelemetry-sdk>=1.20,<2' >&2 ||
			die "pip could not install redis-py and opentelemetry-sdk"
	fi
	printf '%s\n' "$py"
}

node_client() {
	local dir="$DELAYD_LOCAL_DIR/node"
	if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
		apt_install --no-install-recommends nodejs npm >&2
	fi
	if [[ ! -f "$dir/node_modules/ioredis/package.json" ]]; then
		log "installing ioredis into $dir"
		mkdir -p "$dir"
		npm install --prefix "$dir" --no-audit --no-fund --silent 'ioredis@5' >&2 ||
			die "npm could not install ioredis"
	fi
	printf '%s\n' "$dir/node_modules"
}

ruby_client() {
	if ! ruby -e 'require "redis"' >/dev/null 2>&1; then
		apt_install --no-install-recommends ruby-redis >&2
	fi
	command -v ruby
}

php_client() {
	if ! php -r 'exit(extension_loaded("redis") ? 0 : 1);' >/dev/null 2>&1; then
		apt_install --no-install-recommends php-cli php-redis >&2
	fi
	command -v php
}

mkdir -p "$DELAYD_LOCAL_DIR"
exec 9>"$DELAYD_LOCAL_DIR/clients.lock"
flock 9
case "${1:-}" in
python) python_client ;;
node) node_client ;;
ruby) ruby_client ;;
php) php_client ;;
all)
	t0="$(now_ms)"
	python_client >/dev/null
	node_client >/dev/null
	ruby_client >/dev/null
	php_client >/dev/null
	log "producer clients ready ($(($(now_ms) - t0)) ms)"
	;;
*)
	die "usage: $0 python|node|ruby|php|all"
	;;
esac
