//go:build tools

// Package tools pins the CNCF distribution registry and go-containerregistry's crane,
// built by ../build.sh for the cluster tier: the images are pushed to that registry
// (python -m images.push, with crane) and the node's containerd pulls them from it,
// as a platform's cluster pulls from its own registry.
package tools

import (
	_ "github.com/distribution/distribution/v3/cmd/registry"
	_ "github.com/google/go-containerregistry/cmd/crane"
)
