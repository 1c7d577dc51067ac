"""triton_ctx_tune: a torch.distributed-native contextual autotuner for Triton.

The public modules sit here: tuner.py (contextual_autotune) and function_tuner.py (autotune) with
options.py (TuneOptions) and errors.py. Below them, one folder per layer, imports running downward:
engine/ (a tuned call, its steps and decisions), compile/ (precompiling configs, compile workers),
store/ (the caches and quarantine), tools/ (logs, report, the CLI) and runtime/ (Triton and
torch.distributed, at the bottom). Each folder's __init__.py says what it holds and what it imports.
"""
from __future__ import annotations

__version__ = "0.1.0"

from .errors import (CollectiveTimeoutError, CtxTuneError, EmptyConfigSpaceError, InvalidOptionError,  # noqa: E402
                     NoProcessGroupError, NothingToValidateError, NoValidConfigError, NoValidPointError,
                     RankMismatchError, StateNotRestorableError, TuneDuringCaptureError, UnattributedLaunchWarning,
                     UnsupportedAutotunerWarning, UserHookError)
from .runtime.clean_exit import import_distributed_nn  # noqa: E402

# Before any decoration imports torch._dynamo: a process group it bound would outlive destroy_process_group().
import_distributed_nn()

from .runtime import compat  # noqa: E402
from .compile import compile_workers  # noqa: E402

# As early as the program allows: Triton's hash of its compiler, which every compile keys on, on a thread
# (compat.prime_soon), and the zygote the compile workers fork from (compile_workers.prestart). Nothing under the
# interpreter, which compiles nothing.
if not compat.interpret_mode():
    compat.prime_soon()
    compile_workers.prestart(at_import=True)

from .compile.compile_workers import start_compile_workers  # noqa: E402
from .runtime.patch import autotuner_patch  # noqa: E402
from .runtime.libraries import tune_like_triton  # noqa: E402
from .runtime.resolver import carry  # noqa: E402
from .engine.session import CallStats  # noqa: E402
from .options import Budget  # noqa: E402
from .tuner import ContextualAutotuner, contextual_autotune  # noqa: E402
from .function_tuner import FunctionAutotuner, autotune  # noqa: E402

__all__ = ["contextual_autotune", "ContextualAutotuner", "autotune", "FunctionAutotuner", "Budget",
           "start_compile_workers", "autotuner_patch", "carry", "tune_like_triton", "CallStats", "CtxTuneError",
           "UnsupportedAutotunerWarning",
           "InvalidOptionError", "EmptyConfigSpaceError", "NoValidConfigError", "RankMismatchError",
           "CollectiveTimeoutError", "TuneDuringCaptureError", "UnattributedLaunchWarning", "NoValidPointError",
           "UserHookError", "NoProcessGroupError", "NothingToValidateError", "StateNotRestorableError", "__version__"]
