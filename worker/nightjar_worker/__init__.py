"""Nightjar worker: load-adaptive speculative decoding for vLLM (planner, elastic draft memory, plugin)."""

__version__ = "0.1.0"
