"""Evaluation harness (`dispatchtune evaluate`) and the performance benchmark scripts."""
