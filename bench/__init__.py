"""Benchmark harness (issue 6): Envoy direct vs a naive processor vs this service.

``python -m bench [--smoke] [--out DIR]`` measures the matrix and writes results.md,
results.json and PNG plots; ``python -m bench profile`` samples the service with py-spy
under load. Nothing here is imported by the service.
"""
