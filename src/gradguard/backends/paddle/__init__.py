"""PaddlePaddle backend (dygraph): guard session, explanations of Paddle's in-place errors, and ``check_op``."""

from ._check import check_op
from ._eager import PaddleLeafInplaceError, enrich_paddle_error, explain
from ._session import PaddleGuardSession

__all__ = ["PaddleGuardSession", "check_op", "explain", "enrich_paddle_error", "PaddleLeafInplaceError"]
