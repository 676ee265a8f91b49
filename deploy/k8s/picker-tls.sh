#!/bin/sh
# Make the TLS material for Envoy <-> picker: a private CA, a picker certificate for the picker Service's
# names and a client certificate for the gateways (used when the picker requires one:
# components/picker-mtls), then print the kubectl commands that store them as the pointsman-picker-tls
# and pointsman-gateway-tls Secrets.
#   deploy/k8s/picker-tls.sh DIR
# Writes DIR/ca.crt, DIR/ca.key (keep it safe, or delete it), DIR/tls.crt, DIR/tls.key (the picker's),
# DIR/gateway.crt, DIR/gateway.key (the gateways'). Run again with DIR/ca.key still there, it keeps the CA
# and renews both certificates: gateways go on trusting the picker, and the picker's TLS sidecar serves
# the new certificate once the Secret is updated, without a restart.
set -eu
dir=${1:?usage: $0 DIR}
namespace=${NAMESPACE:-pointsman}
host="pointsman-picker.$namespace.svc.cluster.local"
mkdir -p "$dir"
if [ ! -f "$dir/ca.key" ]; then
  openssl req -x509 -newkey rsa:2048 -nodes -days 825 -subj "/CN=pointsman-picker-ca" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -keyout "$dir/ca.key" -out "$dir/ca.crt" 2>/dev/null
fi
# issue NAME CN EXTENSIONS: DIR/NAME.crt and DIR/NAME.key, signed by the CA.
issue() {
  openssl req -newkey rsa:2048 -nodes -subj "/CN=$2" -keyout "$dir/$1.key" -out "$dir/$1.csr" 2>/dev/null
  printf '%s\n' "$3" >"$dir/$1.ext"
  openssl x509 -req -in "$dir/$1.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" -CAcreateserial -days 825 \
    -extfile "$dir/$1.ext" -out "$dir/$1.crt" 2>/dev/null
  rm -f "$dir/$1.csr" "$dir/$1.ext"
}
issue tls "$host" "subjectAltName=DNS:$host,DNS:pointsman-picker.$namespace.svc,DNS:pointsman-picker
extendedKeyUsage=serverAuth"
issue gateway pointsman-gateway "subjectAltName=DNS:pointsman-gateway
extendedKeyUsage=clientAuth"
rm -f "$dir/ca.srl"
echo "kubectl -n $namespace create secret generic pointsman-picker-tls" \
  "--from-file=$dir/ca.crt --from-file=$dir/tls.crt --from-file=$dir/tls.key"
echo "kubectl -n $namespace create secret tls pointsman-gateway-tls" \
  "--cert=$dir/gateway.crt --key=$dir/gateway.key"
