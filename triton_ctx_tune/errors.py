"""Error classes. Each message says what went wrong and how to fix it."""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

T = TypeVar("T")


class CtxTuneError(RuntimeError):
    """Base class of every error raised by triton_ctx_tune."""


class InvalidOptionError(CtxTuneError, ValueError):
    """An argument or environment variable has a value the tuner cannot use."""

    def __init__(self, name: str, value: object, expected: str) -> None:
        super().__init__(f"{name}={value!r} is not valid: expected {expected}.")
        self.name = name
        self.value = value


class UnknownOptionError(InvalidOptionError):
    """A keyword that contextual_autotune does not know, most often a misspelt one."""

    def __init__(self, name: str, value: object, valid: Sequence[str], closest: str | None) -> None:
        hint = f" Did you mean {closest}={value!r}?" if closest else ""
        super().__init__(name, value, f"one of the known options: {', '.join(valid)}")
        self.args = (f"{self.args[0]}{hint}",)
        self.valid = list(valid)
        self.closest = closest


class EmptyConfigSpaceError(CtxTuneError):
    """Pruning left no config to tune."""

    def __init__(self, kernel: str, key: object) -> None:
        super().__init__(
            f"kernel {kernel}, key {key!r}: no config is left after prune_configs_by. "
            "Make early_config_prune return at least one config, or raise perf_model's top_k.")
        self.kernel = kernel
        self.key = key


def distinct_reasons(failures: Mapping[str, Sequence[str]], limit: int = 300) -> list[str]:
    """The distinct failure reasons of `failures` (config -> ["rank r: reason", ...]), most common first, as
    lines "N x reason [ranks ...]": the rank prefix moved to the end, each reason cut to `limit` characters
    (a reason names its cause first, so the cut loses only the end of a source excerpt)."""
    counts: dict[str, int] = {}
    ranks: dict[str, set[str]] = {}
    for reasons in failures.values():
        for reason in reasons:
            rank, text = "", reason
            if reason.startswith("rank ") and ": " in reason:
                rank, text = reason[len("rank "):].split(": ", 1)
            text = text if len(text) <= limit else text[:limit - 3].rstrip() + "..."
            counts[text] = counts.get(text, 0) + 1
            if rank:
                ranks.setdefault(text, set()).add(rank)
    lines = []
    for text, n in sorted(counts.items(), key=lambda item: -item[1]):
        who = sorted(ranks.get(text, ()), key=lambda r: (len(r), r))
        where = f" [{'rank' if len(who) == 1 else 'ranks'} {', '.join(who)}]" if who else ""
        lines.append(f"{n} x {text}{where}")
    return lines


class NoValidConfigError(CtxTuneError):
    """Every config of one (kernel, key) failed, on this rank or on another one."""

    def __init__(self, kernel: str, key: object, failures: Mapping[str, Sequence[str]]) -> None:
        lines = [f"kernel {kernel}, key {key!r}: every config failed, so there is nothing to choose.",
                 "Reasons, most common first (each reason once, with how many configs and ranks gave it):"]
        lines += [f"  {line}" for line in distinct_reasons(failures)]
        lines.append("Configs: " + "; ".join(f"{{{config}}}" for config in failures))
        lines.append("Fix: add configs that fit this GPU (smaller blocks, fewer stages), or prune the ones that "
                     "cannot compile with prune_configs_by. The full texts are in the rank logs ('error' event).")
        super().__init__("\n".join(lines))
        self.kernel = kernel
        self.key = key
        self.failures = dict(failures)


class NoValidPointError(NoValidConfigError):
    """Every point of a function's space (autotune's config_space) failed, on this rank or on another one.

    A NoValidConfigError, so that code catching the kernel-level error keeps catching it."""

    def __init__(self, function: str, failures: Mapping[str, Sequence[str]]) -> None:
        CtxTuneError.__init__(self, "\n".join(
            [f"function {function}: every point of config_space failed, so there is nothing to choose."]
            + [f"  point {point}: " + "; ".join(reasons) for point, reasons in failures.items()]
            + ["Fix: make every point a set of keyword arguments the function takes and can run with "
               "(remove or correct the failing points in config_space, or drop them with prune_fn)."]))
        self.kernel = function
        self.function = function
        self.key = None
        self.failures = dict(failures)


class UserHookError(CtxTuneError):
    """A function the user handed the tuner (key_fn, prune_fn, a callable config_space, reference,
    compare) raised, or returned something the tuner cannot use. The original exception is chained."""

    def __init__(self, hook: str, problem: str, fix: str) -> None:
        super().__init__(f"{hook} {problem}. Fix: {fix}")
        self.hook = hook


def call_hook(hook: str, fix: str, fn: Callable[..., T], *args: Any,
              check: Callable[[T], str | None] | None = None, **kwargs: Any) -> T:
    """Call a user's hook; its exception, or a result `check` finds wrong, becomes a UserHookError naming it.

    The one place every hook goes through, so that an error in user code says which of the user's
    functions raised and what it must do, and the user's own exception stays in the chain."""
    try:
        result = fn(*args, **kwargs)
    except CtxTuneError:
        raise  # ours already names its cause and fix (e.g. a tuned function called inside the hook)
    except Exception as e:
        raise UserHookError(hook, f"raised {type(e).__name__}: {e}", fix) from e
    problem = check(result) if check is not None else None
    if problem is not None:
        raise UserHookError(hook, problem, fix)
    return result


class NoProcessGroupError(CtxTuneError):
    """is_dist=True (or autotune_pg=) in a process where torch.distributed has no process group."""

    def __init__(self, function: str) -> None:
        super().__init__(
            f"{function} is tuned with is_dist=True, but torch.distributed has no process group in this process "
            "(init_process_group was not called, or destroy_process_group was), so its ranks could not agree on "
            "the configs. Fix: call torch.distributed.init_process_group(...) before the first call, or pass "
            "is_dist=False to tune in this process alone.")
        self.function = function


class NothingToValidateError(CtxTuneError):
    """validate=True, but the result (or the reference) holds no tensor to compare."""

    def __init__(self, function: str, what: str, result: object) -> None:
        shown = repr(result)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        super().__init__(
            f"{function}: validate=True, but {what} holds no tensor to compare (it is {shown}), so validation "
            "would check nothing. Fix: return the output tensors from the function (and from reference=), pass "
            "compare=(result, reference) -> bool to judge results your own way, or pass validate=False.")
        self.function = function


class RankMismatchError(CtxTuneError):
    """Ranks are about to tune different things, which would deadlock or diverge."""

    def __init__(self, details: str) -> None:
        super().__init__(
            "ranks disagree on what to tune:\n" + details +
            "\nFix: every rank of the group must call the tuned function with the same shapes, dtypes and "
            "config spaces; tune rank-dependent shapes with is_dist=False or a group of the ranks that match.")


class CollectiveTimeoutError(CtxTuneError):
    """A collective of the tuner did not complete in time."""

    def __init__(self, what: str, timeout_s: float, rank: int, world: int) -> None:
        super().__init__(
            f"rank {rank} of {world}: the tuner's collective '{what}' did not complete within {timeout_s:g} s. "
            "Another rank has died, raised, or is not tuning the same function (for instance, it found the keys "
            "already cached because it tuned the kernel outside a contextual_autotune call). "
            "Fix that rank, or raise the limit with timeout_s= or TRITON_CTX_TUNE_TIMEOUT.")
        self.what = what
        self.timeout_s = timeout_s


class ScheduleMismatchError(CtxTuneError):
    """Ranks were about to issue different collectives of the tuner (the schedule guard, collectives.py)."""

    def __init__(self, rank: int, views: Sequence[Mapping[str, Any]]) -> None:
        groups: dict[str, list[int]] = {}
        for r, v in enumerate(views):
            text = (f"collective #{v['seq']} '{v['what']}' (call {v['call']}"
                    + (f" of {v['function']}" if v.get("function") else "") + f", step {v['step']}"
                    + (f", {v['doing']}" if v.get("doing") else "") + f"; {v['op']}, {v['shape']})")
            groups.setdefault(text, []).append(r)
        lines = [f"  rank{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))}: {t}" for t, rs in groups.items()]
        super().__init__(
            f"rank {rank}: ranks were about to issue different collectives of the tuner, so none was issued:\n"
            + "\n".join(lines) + "\nFix: every rank must call the tuned function the same way (same arguments, "
            "options and launches) and every rank must leave it the same way; if they did, this is a bug in the "
            "tuner's schedule: report it with every rank's JSONL log (its 'collective' events).")
        self.rank = rank
        self.views = list(views)


class UnattributedLaunchWarning(UserWarning):
    """A launch Triton will tune on its own, on this rank alone, while a tuning call is open."""

    def __init__(self, kernel: str, key: object) -> None:
        super().__init__(
            f"kernel {kernel}, key {key!r} was launched outside any tuning call while one is open in this "
            "process, so Triton's own autotuner tunes it on this rank alone. If the tuned function caused this "
            "launch from a thread it started, wrap that thread's target with triton_ctx_tune.carry(fn).")
        self.kernel = kernel
        self.key = key


class UnsupportedAutotunerWarning(UserWarning):
    """An Autotuner subclass overrides run in a way a tuning call does not know: it is not tuned."""

    def __init__(self, kernel: str, cls: str, does: str) -> None:
        super().__init__(
            f"kernel {kernel}: its autotuner is a {cls}, which {does}. A tuning call cannot tune it as Triton's "
            "Autotuner: inside one it runs its first config, untuned and the same on every rank, instead of "
            "benchmarking itself on the call's buffers on each rank alone. If its run keeps the meaning of "
            "Triton's (benchmark the configs, keep the fastest per key), declare it with "
            f"triton_ctx_tune.tune_like_triton({cls.rsplit('.', 1)[-1]}, key=...) and it is tuned like any "
            "autotuned kernel; otherwise tune it outside tuning calls, with its own run.")
        self.kernel = kernel
        self.cls = cls


class TuneDuringCaptureError(CtxTuneError):
    """A call would tune while the current CUDA stream is being captured into a graph."""

    def __init__(self, function: str, kernel: str, key: object) -> None:
        super().__init__(
            f"{function}: kernel {kernel}, key {key!r} is not tuned yet and the current CUDA stream is capturing "
            "a graph; tuning re-executes the function and synchronizes, which would invalidate the capture. "
            "Fix: call the function once before capturing it (warm-up), so that every key is tuned.")
        self.function = function


class SlotHangError(CtxTuneError):
    """A slot ran past slot_timeout_s: reported by the rank's watchdog, which then ends the process."""

    def __init__(self, kernel: str, key: str, config: str, seconds: float, rank: int) -> None:
        super().__init__(
            f"rank {rank}: kernel {kernel}, key {key}, config {{{config}}} has run for more than {seconds:g} s "
            "without completing; this process ends now (exit code 124) and the config is quarantined, so the next "
            "run skips it. Fix: restart the job; if the slot was only slow, raise slot_timeout_s or "
            "TRITON_CTX_TUNE_SLOT_TIMEOUT.")
        self.kernel = kernel
        self.config = config


class CacheWarning(UserWarning):
    """A tuning-cache entry could not be read, used or written; the key is tuned instead."""


class CacheError(CtxTuneError):
    """A cache command could not do what was asked (an import file with bad entries, a missing file)."""


class MissingDependencyError(CtxTuneError, ImportError):
    """An optional feature needs a package that is not installed."""

    def __init__(self, feature: str, package: str, extra: str) -> None:
        super().__init__(f"{feature} needs {package}, which is not installed. "
                         f"Fix: pip install {package} (or pip install 'triton_ctx_tune[{extra}]').")
        self.package = package


class StateNotRestorableError(CtxTuneError):
    """A tuning call could not undo its first execution's writes, so it stopped before the second one."""

    def __init__(self, function: str, why: str) -> None:
        super().__init__(
            f"{function}: this tuning call would re-execute the function, but {why}. The state is as it was "
            "before the call (nothing was applied). Fix: raise snapshot_limit_mb= "
            "(or TRITON_CTX_TUNE_SNAPSHOT_LIMIT_MB), "
            "move the state-changing part (optimizer step, in-place updates of large tensors) out of the tuned "
            "function, or tune it once on a copy of the state before the real run.")
        self.function = function
        self.why = why
