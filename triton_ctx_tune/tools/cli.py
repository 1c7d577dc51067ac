"""`python -m triton_ctx_tune`: read tuning logs back, and inspect or move the persistent tuning cache."""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import CacheError, CtxTuneError
from ..store import cache as C
from ..store import function_cache as FC
from ..store.shipped import safe_name, ship_filename
from . import report as R
from .logs import DEFAULT_LOG_DIR

_DESCRIPTION = "Inspect what triton_ctx_tune chose and why, and manage its persistent tuning cache."
_SELECTORS = ("entries to act on: a kernel name, an entry id or a prefix of one (4+ characters), or a file "
              "name; none means every entry")


def _default_log_dir() -> str:
    return os.environ.get("TRITON_CTX_TUNE_LOG_DIR") or DEFAULT_LOG_DIR


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m triton_ctx_tune", description=_DESCRIPTION)
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="{report,tune,cache}")

    rep = verbs.add_parser("report", help="what each (kernel, key) chose and why, from the per-rank logs",
                           description="Read the per-rank rank-*.jsonl logs and print, per kernel and key: the "
                           "chosen config and its reduced time, the runner-up and the margin, the spread of the "
                           "winner's time over ranks, failed configs and why, executions and tuning time.")
    rep.add_argument("log_dir", nargs="?", default=None, metavar="LOG_DIR",
                     help=f"the job's log directory (default: TRITON_CTX_TUNE_LOG_DIR or {DEFAULT_LOG_DIR})")
    rep.add_argument("--plot", metavar="OUT.png", type=Path,
                     help="also draw per-config latency bars per (kernel, key), the winner highlighted "
                     "(needs matplotlib); the extension picks the format (.png, .svg, .pdf, ...; none: .png)")
    rep.set_defaults(run=_report)

    tune = verbs.add_parser("tune", help="run a tune-ahead script under the launcher, then print what it tuned",
                            description="Run SCRIPT (which calls fn.tune_ahead(...)) on every rank under the "
                            "repository's ./launch (torchrun with the launcher's device and NVLink settings; "
                            "plain torchrun where the package is installed without it), with freeze off, "
                            "then print the tune-ahead tables of the run's logs.")
    tune.add_argument("--nproc", type=_positive, default=None, metavar="N",
                      help="processes (GPUs) per node (default: the launcher's: every visible GPU, else 2)")
    tune.add_argument("script", type=Path, metavar="SCRIPT")
    tune.add_argument("script_args", nargs=argparse.REMAINDER, metavar="ARGS")
    tune.set_defaults(run=_tune)

    cache = verbs.add_parser("cache", help="list, show, clear, export or import tuned results",
                             description="The persistent tuning cache: one JSON file per (kernel, key). Export "
                             "writes them all into one file that import loads on another machine, so a cluster "
                             "can use results tuned once elsewhere (they hit only where GPU, world size, versions, "
                             "kernel code, including every @triton.jit function it calls, and configs match).")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--cache-dir", type=Path, default=None,
                        help=f"the cache directory (default: TRITON_CTX_TUNE_CACHE_DIR or {C.DEFAULT_CACHE_DIR})")
    actions = cache.add_subparsers(dest="action", required=True, metavar="{list,show,clear,export,import}")
    p = actions.add_parser("list", parents=[common], help="one line per entry",
                           description="One line per entry: kernel, key, winner, its time, world size, GPU, date.")
    p.set_defaults(run=_cache_list)
    p = actions.add_parser("show", parents=[common], help="every detail of some entries",
                           description="Identity, winner and per-config timings of the selected entries.")
    p.add_argument("select", nargs="*", metavar="SELECTOR", help=_SELECTORS)
    p.set_defaults(run=_cache_show)
    p = actions.add_parser("clear", parents=[common], help="delete entries",
                           description="Delete the selected entries (all of them, and leftover temporary "
                           "files, when no selector is given). Only files this package wrote are touched: those named "
                           "KERNEL-SHA256.json that hold a triton_ctx_tune cache entry (or a damaged one); other files "
                           "in the directory are left alone.")
    p.add_argument("select", nargs="*", metavar="SELECTOR", help=_SELECTORS)
    p.set_defaults(run=_cache_clear)
    p = actions.add_parser("export", parents=[common], help="write entries into one JSON file, or ship them",
                           description="Write the selected valid entries into one JSON file for `cache import`. "
                           "With --ship DIR: one file per (device, tuned function), DIR/{device}-{function}.json, "
                           "function-level entries (autotune(config_space=...)) included, for a library to ship "
                           "and its users to find through config_path= or TRITON_CTX_TUNE_CONFIG_PATH.")
    p.add_argument("file", type=Path, metavar="FILE", nargs="?",
                   help="the export file (not with --ship, where a first word is a selector)")
    p.add_argument("select", nargs="*", metavar="SELECTOR", help=_SELECTORS)
    p.add_argument("--ship", type=Path, metavar="DIR", default=None,
                   help="write DIR/{device}-{function}.json, one file per device and tuned function (DIR is created; "
                   "files of the same name are replaced)")
    p.add_argument("--function", metavar="NAME", default=None,
                   help="with --ship: only the entries tuned by this function (its qualname, or the name in the file)")
    p.set_defaults(run=_cache_export)
    p = actions.add_parser("import", parents=[common], help="load entries from an exported file",
                           description="Validate every entry of FILE (an export, or a single entry file) and "
                           "write them into the cache, each atomically. Nothing is written if any entry is invalid.")
    p.add_argument("file", type=Path, metavar="FILE")
    p.set_defaults(run=_cache_import)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.run(args)
    except CtxTuneError as e:
        print(f"triton_ctx_tune: error: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `... | head` closed the pipe: not an error of ours
        return 0
    return 0


# ---- tune -------------------------------------------------------------------------------------


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive integer, e.g. --nproc 2")
    return int(text)


def _tune(args: argparse.Namespace) -> None:
    if not args.script.is_file():
        raise CtxTuneError(f"{args.script}: no such script. Fix: pass the path of a Python script that calls "
                           "fn.tune_ahead(...) on the tuned functions it serves.")
    launcher = Path(__file__).resolve().parents[2] / "launch"
    env = {**os.environ, "TRITON_CTX_TUNE_FREEZE": "0", "PYTHON": sys.executable}
    if args.nproc is not None:
        env["NPROC"] = str(args.nproc)
    if launcher.is_file():
        cmd = ["bash", str(launcher), str(args.script), *args.script_args]
    else:  # installed without the repository: torchrun itself, with what launch forces
        env.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc_per_node={args.nproc or 1}", str(args.script), *args.script_args]
    code = subprocess.run(cmd, env=env).returncode
    if code != 0:
        raise CtxTuneError(f"the tune-ahead script {args.script} failed (exit code {code}); its ranks printed why "
                           "above. Fix that, then run `python -m triton_ctx_tune tune` again.")
    report = R.build(Path(_default_log_dir()))
    sys.stdout.write("\n".join(R.format_serving(report)) or "the script tuned nothing ahead (no tune_ahead call)\n")


# ---- report -----------------------------------------------------------------------------------


def _report(args: argparse.Namespace) -> None:
    plot = R.check_plot_path(args.plot) if args.plot is not None else None  # before any work
    report = R.build(Path(args.log_dir or _default_log_dir()))
    sys.stdout.write(R.format_report(report))
    if plot is not None:
        R.plot(report, plot)
        print(f"plot written to {plot}" + (" (no extension was given: PNG)" if plot != args.plot else ""))


# ---- cache ------------------------------------------------------------------------------------


def _dir(args: argparse.Namespace, must_exist: bool = True) -> Path:
    directory = C.resolve_dir(args.cache_dir)
    named = args.cache_dir is not None or bool(os.environ.get("TRITON_CTX_TUNE_CACHE_DIR"))
    # A directory the user named that is not there is most often a typo: reading it as an empty
    # cache would hide that. (The default one is simply not created until something is tuned.)
    if must_exist and named and not directory.is_dir():
        source = "--cache-dir" if args.cache_dir is not None else "TRITON_CTX_TUNE_CACHE_DIR"
        raise CacheError(f"the cache directory {directory} ({source}) does not exist"
                         + (" (it is a file)" if directory.exists() else "")
                         + ". Fix: pass the cache_dir the jobs used (check the spelling), or leave "
                         "--cache-dir out for TRITON_CTX_TUNE_CACHE_DIR or the default.")
    return directory


def _matches(path: Path, entry: dict[str, Any] | None, selectors: Sequence[str]) -> bool:
    if not selectors:
        return True
    for s in selectors:
        if s == path.name or (entry is not None and (
                s == entry["identity"]["kernel"] or (len(s) >= 4 and entry["id"].startswith(s)))):
            return True
    return False


def _selected(directory: Path, selectors: Sequence[str]) -> list[tuple[Path, dict[str, Any] | C.CacheEntryError]]:
    rows = [(p, e) for p, e in C.iter_entries(directory)
            if _matches(p, e if isinstance(e, dict) else None, selectors)]
    if selectors and not rows:
        raise CacheError(f"no entry in {directory} matches {' '.join(selectors)}. "
                         "Fix: run `python -m triton_ctx_tune cache list` to see kernel names and ids.")
    return rows


def _winner_ms(entry: dict[str, Any]) -> float:
    return entry["timings"][entry["winner"]["index"]]["ms"]


def _device(ident: dict[str, Any]) -> str:
    return (ident["device"] + (f" {ident['arch']}" if ident["arch"] else "")
            + (f" x{ident['device_count']}" if ident["device_count"] else ""))


def _cache_list(args: argparse.Namespace) -> None:
    directory = _dir(args)
    rows = list(C.iter_entries(directory))
    valid = [(p, e) for p, e in rows if isinstance(e, dict)]
    print(f"{directory}: {len(valid)} entr{'y' if len(valid) == 1 else 'ies'}"
          + (f", {len(rows) - len(valid)} invalid" if len(rows) != len(valid) else ""))
    if valid:
        print(f"{'id':<12}  {'kernel':<20} {'key':<28} {'ms':>10} {'world':>5}  {'device':<20} {'tuned':<25}  winner")
    for _, entry in valid:
        ident = entry["identity"]
        device = _device(ident)
        print(f"{entry['id'][:12]:<12}  {ident['kernel']:<20} {ident['key']:<28} {_winner_ms(entry):>10.4f} "
              f"{ident['world']:>5}  {device:<20} {entry['tuned']['date']:<25}  {entry['winner']['config']}")
    for p, e in rows:
        if isinstance(e, C.CacheEntryError) and e.foreign:
            print(f"NOT AN ENTRY {p}: {e.reason} (named like one, but not written by triton_ctx_tune; "
                  "`cache clear` leaves it alone)")
        elif not isinstance(e, dict):
            print(f"INVALID {p}: {e.reason} (ignored when tuning; `cache clear {p.name}` removes it)")


def _cache_show(args: argparse.Namespace) -> None:
    rows = _selected(_dir(args), args.select)
    for path, e in rows:
        print(path)
        if not isinstance(e, dict):
            print(f"  INVALID: {e.reason}\n")
            continue
        ident, tuned = e["identity"], e["tuned"]
        print(f"  id         {e['id']}")
        functions = [f.get("name", "?") for f in ident["code"].get("functions", []) if isinstance(f, dict)]
        print(f"  kernel     {ident['kernel']} (code sha256 {C.code_digest(ident['code'])[:16]}: "
              + ", ".join(functions) + ")")
        print(f"  key        {ident['key']}")
        device = _device(ident)
        print(f"  valid for  {device}, world {ident['world']}, reduce {ident['reduce']}, stat {ident['stat']}, "
              f"triton {ident['triton']}, torch {ident['torch']}, these {len(ident['configs'])} configs in order")
        extra = ", ".join(f"{k}={tuned[k]}" for k in ("function", "host", "n_warmup", "n_repeat") if k in tuned)
        print(f"  tuned      {tuned['date']}" + (f" ({extra})" if extra else ""))
        print("\n".join(R.format_key(R.from_entry(e), from_log=False)[1:]))
        print()


def _cache_clear(args: argparse.Namespace) -> None:
    directory = _dir(args)
    rows = _selected(directory, args.select)
    removed = 0
    kept: list[Path] = []
    for path, e in rows:
        if isinstance(e, C.CacheEntryError) and e.foreign:
            kept.append(path)  # named like an entry, but its content is someone else's
            continue
        try:
            path.unlink()
            removed += 1
        except FileNotFoundError:
            pass  # a concurrent clear got there first
    temps = 0
    if not args.select:
        for path in C.stale_temp_files(directory):
            try:
                path.unlink()
                temps += 1
            except FileNotFoundError:
                pass
    print(f"removed {removed} entr{'y' if removed == 1 else 'ies'} from {directory}"
          + (f" and {temps} leftover temporary files" if temps else ""))
    others = kept
    if not args.select and directory.is_dir():  # say what a shared folder still holds, and why
        others = sorted(kept + [p for p in directory.iterdir() if not C.is_entry_name(p.name)])
    if others:
        names = ", ".join(p.name for p in others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
        print(f"left {len(others)} other file{'' if len(others) == 1 else 's'} alone, which "
              f"{'is not a tuning-cache entry' if len(others) == 1 else 'are not tuning-cache entries'}: {names}")


def _cache_export(args: argparse.Namespace) -> None:
    if args.ship is not None:
        _cache_ship(args)
        return
    if args.file is None:
        raise CacheError("cache export needs a FILE to write, or --ship DIR. Fix: `python -m triton_ctx_tune cache "
                         "export FILE` (one file for `cache import`) or `... cache export --ship DIR` (per device and "
                         "function).")
    if args.function is not None:
        raise CacheError("--function selects what --ship writes. Fix: add --ship DIR, or select entries by kernel "
                         "name or id after FILE.")
    directory = _dir(args)
    entries = []
    for path, e in _selected(directory, args.select):
        if isinstance(e, dict):
            entries.append(e)
        else:
            print(f"skipped invalid entry {path}: {e.reason}", file=sys.stderr)
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    C.write_json_atomically(args.file, {"format": C.EXPORT_FORMAT, "exported": now, "source": str(directory),
                                        "entries": entries})
    print(f"exported {len(entries)} entr{'y' if len(entries) == 1 else 'ies'} from {directory} to {args.file}")


def _function_entries(directory: Path) -> list[tuple[Path, dict[str, Any] | str]]:
    """Every function-level entry file under <cache dir>/functions/, with its entry or why it is unusable."""
    folder = directory / FC.SUBDIR
    if not folder.is_dir():
        return []
    rows: list[tuple[Path, dict[str, Any] | str]] = []
    for path in sorted(p for p in folder.iterdir() if C.is_entry_name(p.name)):
        try:
            entry = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
            rows.append((path, f"not readable JSON ({e})"))
            continue
        problem = FC.entry_problem(entry)
        rows.append((path, entry if problem is None else problem))
    return rows


def _cache_ship(args: argparse.Namespace) -> None:
    """One export file per (device, tuned function): DIR/{device}-{function}.json."""
    out: Path = args.ship
    if out.exists() and not out.is_dir():
        raise CacheError(f"--ship {out}: it is a file, and --ship writes one file per device and function into a "
                         "directory. Fix: pass a directory (it is created if missing), or drop --ship to write "
                         "one export FILE.")
    directory = _dir(args)
    select = ([str(args.file)] if args.file is not None else []) + list(args.select)
    wanted = args.function

    def chosen(function: str | None) -> bool:
        return wanted is None or function is not None and wanted in (function, safe_name(function))

    files: dict[str, dict[str, list[dict[str, Any]]]] = {}
    unknown = 0
    for path, e in _selected(directory, select):
        if not isinstance(e, dict):
            print(f"skipped invalid entry {path}: {e.reason}", file=sys.stderr)
            continue
        function = e["tuned"].get("function") if isinstance(e["tuned"].get("function"), str) else None
        if not chosen(function):
            continue
        unknown += function is None
        name = ship_filename(e["identity"]["device"], function)
        files.setdefault(name, {"entries": [], "functions": []})["entries"].append(e)
    if not select:  # selectors name kernels and kernel entries; function-level entries go when none is given
        for path, fe in _function_entries(directory):
            if isinstance(fe, str):
                print(f"skipped invalid function-level entry {path}: {fe}", file=sys.stderr)
                continue
            function = fe["identity"]["function"]
            if chosen(function):
                name = ship_filename(fe["identity"]["device"], function)
                files.setdefault(name, {"entries": [], "functions": []})["functions"].append(fe)
    if not files:
        raise CacheError(f"nothing to ship from {directory}" + (f" for --function {wanted}" if wanted else "")
                         + ". Fix: tune first, or run `python -m triton_ctx_tune cache list` to see what is there "
                         "(the `function` of `cache show` is what --function matches).")
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    for name, parts in sorted(files.items()):
        C.write_json_atomically(out / name, {"format": C.EXPORT_FORMAT, "exported": now, "source": str(directory),
                                             "entries": parts["entries"], "functions": parts["functions"]})
        n, f = len(parts["entries"]), len(parts["functions"])
        print(f"shipped {n} kernel entr{'y' if n == 1 else 'ies'}" + (f" and {f} function-level" if f else "")
              + f" to {out / name}")
    if unknown:
        print(f"{unknown} entr{'y' if unknown == 1 else 'ies'} record no tuned function (written by an older "
              "version): shipped in {device}-unknown.json, where they hit just the same", file=sys.stderr)


def load_import_file(path: Path) -> list[dict[str, Any]]:
    """The entries of an export file (or of one entry file), every one validated, or CacheError naming the bad ones."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CacheError(f"{path} does not exist. Fix: pass the file that `cache export FILE` wrote.") from None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise CacheError(f"{path} is not a readable JSON file ({e}). Fix: export it again with "
                         "`python -m triton_ctx_tune cache export FILE` and copy it whole.") from None
    if isinstance(data, dict) and data.get("format") == C.FORMAT:
        entries: Any = [data]
    elif isinstance(data, dict) and data.get("format") == C.EXPORT_FORMAT:
        entries = data.get("entries")
    else:
        raise CacheError(f"{path} is neither a cache export ({C.EXPORT_FORMAT}) nor a cache entry ({C.FORMAT}). "
                         "Fix: pass a file written by `python -m triton_ctx_tune cache export FILE`.")
    if not isinstance(entries, list):
        raise CacheError(f"{path}: 'entries' must be a list. Fix: export the file again.")
    bad = []
    for i, entry in enumerate(entries):
        problem = C.entry_problem(entry)
        if problem is not None:
            ident = entry.get("identity") if isinstance(entry, dict) else None
            what = (f" ({ident.get('kernel')} key={ident.get('key')})" if isinstance(ident, dict) else "")
            bad.append(f"  entry #{i}{what}: {problem}")
    if bad:
        older = any(isinstance(e, dict) and str(e.get("format", "")).startswith("triton_ctx_tune.cache/")
                    and e.get("format") != C.FORMAT for e in entries)
        fix = ("Fix: entries of an older cache format cannot be converted (they do not record the @triton.jit "
               "functions a kernel calls): tune again with this version, then export again." if older else
               "Fix: export the file again from a good cache, or remove those entries.")
        raise CacheError(f"{path}: {len(bad)} of {len(entries)} entries are invalid, so nothing was imported:\n"
                         + "\n".join(bad) + "\n" + fix)
    return entries


def load_import_functions(path: Path) -> list[dict[str, Any]]:
    """The function-level entries of an export file (`cache export --ship` writes them), each validated."""
    data = json.loads(path.read_text(encoding="utf-8"))  # load_import_file read it already
    functions = data.get("functions", []) if isinstance(data, dict) and data.get("format") == C.EXPORT_FORMAT else []
    if not isinstance(functions, list):
        raise CacheError(f"{path}: 'functions' must be a list. Fix: export the file again.")
    bad = [f"  functions #{i}: {problem}" for i, fe in enumerate(functions)
           if (problem := FC.entry_problem(fe)) is not None]
    if bad:
        raise CacheError(f"{path}: {len(bad)} of {len(functions)} function-level entries are invalid, so nothing "
                         "was imported:\n" + "\n".join(bad) + "\nFix: export the file again from a good cache.")
    return functions


def _cache_import(args: argparse.Namespace) -> None:
    directory = _dir(args, must_exist=False)  # importing into a new directory creates it
    entries = load_import_file(args.file)
    functions = load_import_functions(args.file)  # both validated before anything is written
    replaced = 0
    for entry in entries:
        target = directory / C.entry_filename(entry["identity"]["kernel"], entry["id"])
        replaced += target.exists()
        C.write_entry(directory, entry)
    for fe in functions:
        target = FC.entry_path(directory, fe)
        replaced += target.exists()
        C.write_json_atomically(target, fe)
    more = f" and {len(functions)} function-level" if functions else ""
    print(f"imported {len(entries)} entr{'y' if len(entries) == 1 else 'ies'}{more} into {directory}"
          + (f" ({replaced} replaced existing ones)" if replaced else ""))
