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

token="forkd_$(openssl rand 32 | openssl base64 -A | tr '+/' '-_' | tr -d '=')"
sum=$(printf %s "$token" | sha256sum | cut -d' ' -f1)
now=$(date -u +%Y-%m-%dT%H:%M:%SZ)
store="{\"version\":2,\"tokens\":[{\"name\":\"forkd-controller\",\"sha256\":\"$sum\",\"created\":\"$now\",\"role\":\"admin\",\"tenant\":\"\"}]}"

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 3650 \
  -subj "/CN=forkd-node-ca" -keyout "$tmp/ca.key" -out "$tmp/ca.crt" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$name" \
  -keyout "$tmp/tls.key" -out "$tmp/tls.csr" 2>/dev/null
printf 'subjectAltName=DNS:%s\nextendedKeyUsage=serverAuth\n' "$name" > "$tmp/ext"
openssl x509 -req -in "$tmp/tls.csr" -CA "$tmp/ca.crt" -CAkey "$tmp/ca.key" -CAcreateserial \
  -days 825 -extfile "$tmp/ext" -out "$tmp/tls.crt" 2>/dev/null

gw="forkd_$(openssl rand 32 | openssl base64 -A | tr '+/' '-_' | tr -d '=')"
gwsum=$(printf %s "$gw" | sha256sum | cut -d' ' -f1)
gwstore="{\"version\":2,\"tokens\":[{\"name\":\"default\",\"sha256\":\"$gwsum\",\"created\":\"$now\",\"role\":\"user\",\"tenant\":\"default\"}]}"
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=forkd-gateway" \
  -keyout "$tmp/gw.key" -out "$tmp/gw.csr" 2>/dev/null
printf 'subjectAltName=DNS:forkd-gateway,DNS:forkd-gateway.%s.svc,DNS:forkd-gateway.%s.svc.cluster.local\nextendedKeyUsage=serverAuth\n' "$ns" "$ns" > "$tmp/gwext"
openssl x509 -req -in "$tmp/gw.csr" -CA "$tmp/ca.crt" -CAkey "$tmp/ca.key" -CAcreateserial \
  -days 825 -extfile "$tmp/gwext" -out "$tmp/gw.crt" 2>/dev/null

b64() { base64 < "$1" | tr -d '\n'; }
printf %s "$gw" > "$tmp/gwtoken"
printf %s "$gwstore" > "$tmp/gwtokens.json"
printf %s "$token" > "$tmp/token"
printf %s "$store" > "$tmp/tokens.json"
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
