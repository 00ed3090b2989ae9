"""Envoy external-processing service that polices vLLM token-id reuse per route.

Its version: ``ext_proc.version.version()`` (the installed metadata, pyproject.toml's)."""
