#!/usr/bin/env bash
# Generates a throw-away PKI for lnormd's TLS tests (and for trying TLS by
# hand): a CA, a server certificate for 127.0.0.1/localhost, a client
# certificate signed by the CA, and a "rogue" client certificate signed by a
# second, unrelated CA. Keys are EC P-256, certificates valid for 2 days.
#
#   scripts/gen-certs.sh DIR
#
# Writes into DIR (created, mode 0700):
#   ca.crt ca.key                  the trusted CA
#   server.crt server.key          CN=localhost, SAN DNS:localhost, IP:127.0.0.1
#   client.crt client.key          CN=lnorm-client, signed by ca
#   rogue-ca.crt rogue-ca.key      another CA nobody trusts
#   rogue.crt rogue.key            CN=lnorm-client, signed by rogue-ca
#   client.pem rogue.pem           certificate + key in one file (NNG's
#                                  NNG_OPT_TLS_CERT_KEY_FILE, liblnorm's
#                                  tls_cert_key_file)
# Never use these for anything but tests: the keys sit unencrypted in DIR.
set -euo pipefail

dir=${1:?usage: gen-certs.sh DIR}
command -v openssl >/dev/null || { echo "gen-certs: openssl not found" >&2; exit 1; }
mkdir -p "$dir"
chmod 700 "$dir"
cd "$dir"
umask 077

days=2
key() { openssl ecparam -name prime256v1 -genkey -noout -out "$1" 2>/dev/null; }

# ca NAME CN: a self-signed CA certificate.
ca() {
  key "$1.key"
  openssl req -new -x509 -key "$1.key" -out "$1.crt" -days "$days" -sha256 \
    -subj "/CN=$2" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" >/dev/null 2>&1
}

# leaf NAME CN CA USAGE [SAN]: a certificate for NAME signed by CA.
leaf() {
  local name=$1 cn=$2 issuer=$3 usage=$4 san=${5:-}
  key "$name.key"
  openssl req -new -key "$name.key" -out "$name.csr" -subj "/CN=$cn" >/dev/null 2>&1
  {
    echo "basicConstraints=critical,CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=$usage"
    [ -n "$san" ] && echo "subjectAltName=$san"
  } > "$name.ext"
  openssl x509 -req -in "$name.csr" -CA "$issuer.crt" -CAkey "$issuer.key" \
    -CAcreateserial -out "$name.crt" -days "$days" -sha256 \
    -extfile "$name.ext" >/dev/null 2>&1
  rm -f "$name.csr" "$name.ext"
}

ca ca "lnormd test CA"
ca rogue-ca "lnormd rogue CA"
leaf server localhost ca serverAuth "DNS:localhost,IP:127.0.0.1"
leaf client lnorm-client ca clientAuth
leaf rogue lnorm-client rogue-ca clientAuth
rm -f ./*.srl
cat client.crt client.key > client.pem
cat rogue.crt rogue.key > rogue.pem

# Sanity: the chain verifies, and the rogue does not.
openssl verify -CAfile ca.crt server.crt client.crt >/dev/null
if openssl verify -CAfile ca.crt rogue.crt >/dev/null 2>&1; then
  echo "gen-certs: rogue certificate unexpectedly verifies against ca" >&2
  exit 1
fi
chmod 644 ./*.crt
echo "gen-certs: wrote CA, server, client and rogue certificates to $dir"
