"""Tests of the built-in sidecar components (runq.sidecar)."""
