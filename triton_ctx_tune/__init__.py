"""triton_ctx_tune: a torch.distributed-native contextual autotuner for Triton."""
from __future__ import annotations

__version__ = "0.1.0"

from .errors import (CollectiveTimeoutError, CtxTuneError, EmptyConfigSpaceError, InvalidOptionError,  # noqa: E402
                     NoProcessGroupError, NothingToValidateError, NoValidConfigError, NoValidPointError,
                     RankMismatchError, StateNotRestorableError, TuneDuringCaptureError, UnattributedLaunchWarning,
                     UserHookError)
from .compile_workers import start_compile_workers  # noqa: E402
from .patch import autotuner_patch  # noqa: E402
from .resolver import carry  # noqa: E402
from .session import CallStats  # noqa: E402
from .tuner import ContextualAutotuner, contextual_autotune  # noqa: E402
from .function_tuner import FunctionAutotuner, autotune  # noqa: E402

__all__ = ["contextual_autotune", "ContextualAutotuner", "autotune", "FunctionAutotuner", "start_compile_workers",
           "autotuner_patch", "carry", "CallStats", "CtxTuneError",
           "InvalidOptionError", "EmptyConfigSpaceError", "NoValidConfigError", "RankMismatchError",
           "CollectiveTimeoutError", "TuneDuringCaptureError", "UnattributedLaunchWarning", "NoValidPointError",
           "UserHookError", "NoProcessGroupError", "NothingToValidateError", "StateNotRestorableError", "__version__"]
