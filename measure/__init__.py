"""Measuring candidates: building binaries, running and benchmarking them, checking their outputs."""
