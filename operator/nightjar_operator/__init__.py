"""Nightjar operator: reconciles NightjarDeployment resources (kopf)."""

__version__ = "0.1.0"
