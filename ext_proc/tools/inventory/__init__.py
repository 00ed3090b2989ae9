"""Inventories of what the programs in front of and behind vLLM read."""
