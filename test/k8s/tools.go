//go:build tools

// Package k8s pins the control-plane binaries that scripts/k8s-testenv.sh
// builds for the tests under this module: kube-apiserver and etcd, at the
// versions in go.mod, from the Go module proxy.
package k8s

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
)
