// The pod sandbox ("pause") program for the cluster tests' node.
module rljob.dev/tests/gotools/pause

go 1.24.0
