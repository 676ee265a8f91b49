#!/bin/sh
# Make the TLS material for Envoy -> picker: a private CA and a picker certificate for the picker
# Service's names, then print the kubectl command that stores them as the pointsman-picker-tls Secret.
#   deploy/k8s/picker-tls.sh DIR
# Writes DIR/ca.crt, DIR/ca.key (keep it safe, or delete it), DIR/tls.crt, DIR/tls.key.
set -eu
dir=${1:?usage: $0 DIR}
namespace=${NAMESPACE:-pointsman}
host="pointsman-picker.$namespace.svc.cluster.local"
mkdir -p "$dir"
openssl req -x509 -newkey rsa:2048 -nodes -days 825 -subj "/CN=pointsman-picker-ca" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
  -keyout "$dir/ca.key" -out "$dir/ca.crt" 2>/dev/null
openssl req -newkey rsa:2048 -nodes -subj "/CN=$host" -keyout "$dir/tls.key" -out "$dir/tls.csr" 2>/dev/null
printf 'subjectAltName=DNS:%s,DNS:pointsman-picker.%s.svc,DNS:pointsman-picker\nextendedKeyUsage=serverAuth\n' \
  "$host" "$namespace" >"$dir/tls.ext"
openssl x509 -req -in "$dir/tls.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" -CAcreateserial -days 825 \
  -extfile "$dir/tls.ext" -out "$dir/tls.crt" 2>/dev/null
rm -f "$dir/tls.csr" "$dir/tls.ext" "$dir/ca.srl"
echo "kubectl -n $namespace create secret generic pointsman-picker-tls" \
  "--from-file=$dir/ca.crt --from-file=$dir/tls.crt --from-file=$dir/tls.key"
