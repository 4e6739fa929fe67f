#!/usr/bin/env bash
# Test certificates made with openssl at test time: a private CA, a server
# certificate for 127.0.0.1 / localhost, a client certificate, and a second
# CA that signed nothing (for "wrong CA" cases).
#
#   deploy/local/certs.sh DIR
#
# Writes into DIR (created if missing), each as PEM:
#   ca.crt ca.key            the CA that signed server.crt and client.crt
#   server.crt server.key    CN=localhost, SAN IP:127.0.0.1, DNS:localhost
#   client.crt client.key    CN=delayd (clientAuth)
#   other-ca.crt             an unrelated CA
#   expired.crt expired.key  a server certificate signed by ca.crt whose
#                            validity ended in the past
# Keys are unencrypted and readable only by their owner, except server.key
# and client.key which are 0644 so a server running as another user can
# read them. Idempotent: an existing complete DIR is left as it is.
set -euo pipefail

LOG_TAG=certs
# shellcheck source=deploy/local/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

(($# == 1)) || usage
dir="$1"
command -v openssl >/dev/null 2>&1 || apt_install openssl
mkdir -p "$dir"
cd "$dir"
if [[ -s ca.crt && -s server.crt && -s client.crt && -s other-ca.crt && -s expired.crt ]]; then
	exit 0
fi

quiet() { "$@" >/dev/null 2>&1 || { log "failed: $*"; "$@"; }; }

ext_server="subjectAltName=IP:127.0.0.1,DNS:localhost
basicConstraints=CA:FALSE
keyUsage=digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth"
ext_client="basicConstraints=CA:FALSE
keyUsage=digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"

ca() { # NAME CN
	quiet openssl req -x509 -new -nodes -newkey rsa:2048 -sha256 -days 3650 \
		-keyout "$1.key" -out "$1.crt" -subj "/CN=$2" \
		-addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"
}
leaf() { # NAME CN EXTENSIONS [openssl x509 dating args...]
	local name="$1" cn="$2" ext="$3"
	shift 3
	quiet openssl req -new -nodes -newkey rsa:2048 -keyout "$name.key" -out "$name.csr" -subj "/CN=$cn"
	printf '%s\n' "$ext" >"$name.ext"
	quiet openssl x509 -req -in "$name.csr" -CA ca.crt -CAkey ca.key -CAcreateserial \
		-sha256 -extfile "$name.ext" -out "$name.crt" "$@"
	rm -f "$name.csr" "$name.ext"
}

ca ca "delayd test CA"
ca other-ca "delayd unrelated CA"
rm -f other-ca.key
leaf server localhost "$ext_server" -days 3650
leaf client delayd "$ext_client" -days 3650
# An expired certificate: OpenSSL 3.0's x509 cannot backdate, but -days 0
# makes "not after" equal to "now", so it has expired a second later.
leaf expired localhost "$ext_server" -days 0
sleep 1
chmod 0600 ca.key
chmod 0644 server.key client.key expired.key
log "certificates in $dir"
