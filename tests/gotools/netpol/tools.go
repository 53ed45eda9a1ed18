//go:build tools

// Package tools pins kube-network-policies (SIG Network's NetworkPolicy enforcer on
// nftables), built by ../build.sh for the cluster tier's node: it enforces the jobs'
// NetworkPolicies there, as a platform's network plugin does.
package tools

import (
	_ "sigs.k8s.io/kube-network-policies/cmd"
)
