//go:build tools

// Package tools pins Kueue, built by ../build.sh for the cluster tier's queue:
// its manager (cmd/kueue) and, beside it, the manifests of the same tag
// (config/components: the CRDs, webhooks and RBAC a platform team installs).
package tools

import (
	_ "sigs.k8s.io/kueue/cmd/kueue"
)
