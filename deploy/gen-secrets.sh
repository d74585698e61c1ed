#!/bin/sh
# Prints the Secrets forkd on Kubernetes needs, for `kubectl apply -f -`:
#   forkd-controller-token  the controller's bearer token (plaintext)
#   forkd-node-tokens       the daemons' token store (its SHA-256 only)
#   forkd-node-tls          a CA, and a certificate for the name the
#                           controller checks (forkd-node; pod IPs change)
#   forkd-gateway-tokens    the cluster gateway's callers (SHA-256 only): one
#                           user token of tenant (namespace) "default"
#   forkd-gateway-client    that token's plaintext and the CA, to hand to
#                           whoever uses the API (FORKD_HOST=https://forkd-gateway.NS.svc,
#                           FORKD_TOKEN, FORKD_CA_CERT)
#   forkd-gateway-tls       the gateway's certificate (forkd-gateway.NS.svc)
# The token is the node daemons' admin: they serve the controller alone
# (users reach sandboxes through Kubernetes objects, namespaced by RBAC),
# and the controller reads each node's capacity (GET /v1/info shows it to
# admins only) to place forks. Keep it in the controller's Secret.
# Needs openssl and sha256sum. Keep the output out of version control.
set -eu
ns=${NAMESPACE:-forkd-system}
name=${SERVER_NAME:-forkd-node}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# newtoken: a random bearer token.
newtoken() { printf 'forkd_%s' "$(openssl rand 32 | openssl base64 -A | tr '+/' '-_' | tr -d '=')"; }
# store NAME TOKEN ROLE TENANT: a one-token store in forkd's tokens.json
# format (its SHA-256 only).
store() {
  printf '{"version":2,"tokens":[{"name":"%s","sha256":"%s","created":"%s","role":"%s","tenant":"%s"}]}' \
    "$1" "$(printf %s "$2" | sha256sum | cut -d' ' -f1)" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$3" "$4"
}
# cert OUT CN SAN: a key and a server certificate for SAN (subjectAltName
# entries), signed by the CA: OUT.key, OUT.crt.
cert() {
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$2" \
    -keyout "$tmp/$1.key" -out "$tmp/$1.csr" 2>/dev/null
  printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth\n' "$3" > "$tmp/$1.ext"
  openssl x509 -req -in "$tmp/$1.csr" -CA "$tmp/ca.crt" -CAkey "$tmp/ca.key" -CAcreateserial \
    -days 825 -extfile "$tmp/$1.ext" -out "$tmp/$1.crt" 2>/dev/null
}

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 3650 \
  -subj "/CN=forkd-node-ca" -keyout "$tmp/ca.key" -out "$tmp/ca.crt" 2>/dev/null
token=$(newtoken)
store forkd-controller "$token" admin "" > "$tmp/tokens.json"
cert tls "$name" "DNS:$name"
gw=$(newtoken)
store default "$gw" user default > "$tmp/gwtokens.json"
cert gw forkd-gateway "DNS:forkd-gateway,DNS:forkd-gateway.$ns.svc,DNS:forkd-gateway.$ns.svc.cluster.local"

b64() { base64 < "$1" | tr -d '\n'; }
printf %s "$gw" > "$tmp/gwtoken"
printf %s "$token" > "$tmp/token"
cat <<YAML
apiVersion: v1
kind: Secret
metadata: {name: forkd-controller-token, namespace: $ns}
data:
  token: $(b64 "$tmp/token")
---
apiVersion: v1
kind: Secret
metadata: {name: forkd-node-tokens, namespace: $ns}
data:
  tokens.json: $(b64 "$tmp/tokens.json")
---
apiVersion: v1
kind: Secret
metadata: {name: forkd-node-tls, namespace: $ns}
type: kubernetes.io/tls
data:
  ca.crt: $(b64 "$tmp/ca.crt")
  tls.crt: $(b64 "$tmp/tls.crt")
  tls.key: $(b64 "$tmp/tls.key")
---
apiVersion: v1
kind: Secret
metadata: {name: forkd-gateway-tokens, namespace: $ns}
data:
  tokens.json: $(b64 "$tmp/gwtokens.json")
---
apiVersion: v1
kind: Secret
metadata: {name: forkd-gateway-client, namespace: $ns}
data:
  token: $(b64 "$tmp/gwtoken")
  ca.crt: $(b64 "$tmp/ca.crt")
---
apiVersion: v1
kind: Secret
metadata: {name: forkd-gateway-tls, namespace: $ns}
type: kubernetes.io/tls
data:
  tls.crt: $(b64 "$tmp/gw.crt")
  tls.key: $(b64 "$tmp/gw.key")
YAML
