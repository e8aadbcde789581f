"""Re-export of the bundled pair's location (``nightjar_worker.models``) for engine users."""

from nightjar_worker.models import bundled_pair, qwen_pair, require_model_dir

__all__ = ["bundled_pair", "qwen_pair", "require_model_dir"]
