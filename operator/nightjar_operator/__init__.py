"""Nightjar operator: reconciles NightjarDeployment resources (kopf)."""

from nightjar_contract import __version__

__all__ = ["__version__"]
