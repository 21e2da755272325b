"""PyTorch backend: saved-tensor hooks, the write log, fingerprints, naming and eager-error enrichment."""

from .eager import enrich_eager_error
from .session import FINGERPRINT_MODES, TorchGuardSession

__all__ = ["TorchGuardSession", "enrich_eager_error", "FINGERPRINT_MODES"]
