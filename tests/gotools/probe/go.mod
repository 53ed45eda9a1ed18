// A small static program the cluster tests run in pods (HTTP server and client).
module rljob.dev/tests/gotools/probe

go 1.24.0
