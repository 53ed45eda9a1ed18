//go:build tools

// Package tools pins the Kubernetes commands built by ../build.sh: the control
// plane (kube-apiserver, kube-controller-manager, kubectl) and the node
// (kubelet, kube-scheduler, kube-proxy).
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
