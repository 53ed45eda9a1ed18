//go:build tools

// Package tools pins the helm command built by ../build.sh.
package tools

import _ "helm.sh/helm/v3/cmd/helm"
