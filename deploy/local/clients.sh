#!/usr/bin/env bash
# The Redis client libraries the producer snippets in docs/id-mode.md use,
# installed from their registries into <repo>/.local on first use, so a fresh
# CI machine gets them too. The tests run the snippets with them.
#
#   deploy/local/clients.sh python   prints a python that can `import redis`
#   deploy/local/clients.sh node     prints a NODE_PATH holding ioredis
set -euo pipefail

LOG_TAG="clients"
# shellcheck source=deploy/local/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

case "${1:-}" in
python)
	py="$(ensure_venv)"
	if ! "$py" -c 'import redis' >/dev/null 2>&1; then
		log "installing redis-py into $(dirname "$(dirname "$py")")"
		"$py" -m pip install -q --disable-pip-version-check 'redis>=5,<6' >&2 ||
			die "pip could not install redis-py"
	fi
	printf '%s\n' "$py"
	;;
node)
	command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 || apt_install nodejs npm
	dir="$DELAYD_LOCAL_DIR/node"
	if [[ ! -f "$dir/node_modules/ioredis/package.json" ]]; then
		log "installing ioredis into $dir"
		mkdir -p "$dir"
		npm install --prefix "$dir" --no-audit --no-fund --silent 'ioredis@5' >&2 ||
			die "npm could not install ioredis"
	fi
	printf '%s\n' "$dir/node_modules"
	;;
*)
	die "usage: $0 python|node"
	;;
esac
