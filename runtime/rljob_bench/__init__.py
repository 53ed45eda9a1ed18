"""Benchmarks that print figures (`rljob bench ...`); never timed assertions."""
