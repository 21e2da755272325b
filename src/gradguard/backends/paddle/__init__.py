"""PaddlePaddle backend (dygraph): guard session, explanations of Paddle's in-place errors, and ``check_op``."""

from .check import check_op
from .eager import PaddleLeafInplaceError, enrich_paddle_error, explain
from .session import PaddleGuardSession

__all__ = ["PaddleGuardSession", "check_op", "explain", "enrich_paddle_error", "PaddleLeafInplaceError"]
