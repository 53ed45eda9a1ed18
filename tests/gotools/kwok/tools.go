//go:build tools

// Package tools pins kwok, built by ../build.sh for the scale bench
// (tests/cluster/bench_operator.py): its controller (cmd/kwok) keeps simulated
// nodes Ready and marks the pods bound to them running, and, beside it, the stages
// of the same tag that say how (kustomize/stage: node and pod, "fast").
package tools

import (
	_ "sigs.k8s.io/kwok/cmd/kwok"
)
