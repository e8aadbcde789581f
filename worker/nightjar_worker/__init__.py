"""Nightjar worker: load-adaptive speculative decoding for vLLM (planner, elastic draft memory, plugin)."""

from nightjar_contract import __version__

__all__ = ["__version__"]
