"""Envoy external-processing service that polices vLLM token-id reuse per route."""

__version__ = "0.1.0"
