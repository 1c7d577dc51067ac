"""The decisions at a step's end: reduce every rank's timings, let rank 0 choose, and commit.

Rank 0 turns the reduced times into a keep-mask per tunable (a screening pass's survivors, or a
one-hot winner) and broadcasts it, so every rank's schedule and choice are identical. A kernel's
winner goes into Triton's Autotuner.cache, the persistent cache and the logs; a function-level
point's into the call's stats and the logs (function_tuner.py stores it in the function cache).
"""
from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ..errors import NoValidConfigError, NoValidPointError
from ..runtime.compat import config_str, notify_listener, same_binary
from ..tools.logs import fmt_ms
from .budget import PARENT_BAND, BudgetSearch, share_wave
from .search import AnyTunable, PointTunable
from .state import (
    CONFIRM_ROUNDS,
    RACE_BAND,
    Choice,
    KeyState,
    Tunable,
    close_candidates,
    confirm_rounds,
    fastest_spread,
    screen,
    stable_winner,
)

# How rank 0's keep-mask marks a winner that a tie-break chose (1: the fastest, or a screening survivor).
TIE_CODES = {None: 1, "incumbent": 2}
TIE_BY_CODE = {code: how for how, code in TIE_CODES.items()}
CONFIRM_CODE = 4  # a close candidate, re-timed before the key is decided
CONFIRM_E2E_CODE = 6  # the same, timed end to end: the key overlapped another stream's work
READMIT_CODE = 5  # a config a split screening dropped, timed in lockstep after all
FORCED_CHECK_CODE = 7  # the call's budget is spent, but no config has run on every rank: one lockstep round first
RACE_CODE = 8  # a candidate that stays in an end-to-end confirmation's race for one more round
LOCKSTEP_CODE = 9  # a screening's survivor that stays for its next round (_lockstep_stay)
POINT_STAT = 2  # the column of a point's end-to-end times that decides it: q80 (_times)
POINT_SCREEN = 2.5  # the screening factor of a point's kernel keys, at least (_screen_factor)
BUDGET_CODE = 100  # a budgeted search's next rung: BUDGET_CODE + the config's timed slots in it (budget.py)

if TYPE_CHECKING:
    from .services import StepServices


@dataclass
class TunedKey:
    kernel: str
    key: tuple
    config: str
    ms: float
    configs: int
    failed: int
    point: int | None = None  # the function-level point it was tuned under


class Decisions:
    """Session's deciding half: it reads the step's tunables, options, collectives and logs (services.py)."""

    def __init__(self, services: StepServices) -> None:
        self.services = services

    def decide(self, finishing: list[AnyTunable], step_s: float | None = None) -> None:
        """Decide what comes next for each tunable whose slots are done; `step_s`: what a step costs on this rank
        now (the session's StepClock), which rank 0 prices a seconds budget's next rung with."""
        svc = self.services
        width = max(len(s.configs) for s in finishing)
        # Per config: the statistic, its 20th and 80th percentiles, and the fastest sample (_lockstep_stay).
        local = torch.full((len(finishing), width, 4), math.inf, dtype=torch.float64)
        for i, s in enumerate(finishing):
            local[i, : len(s.configs), :3] = torch.tensor(s.local_stats(svc.opts.stat), dtype=torch.float64)
            local[i, : len(s.configs), 3] = torch.tensor(s.local_fastest(), dtype=torch.float64)
        per_rank = svc.comm.all_gather(local, "gather timings")  # [world, states, configs, 4]
        per_rank = torch.nan_to_num(per_rank, nan=math.inf, posinf=math.inf)
        reduced = per_rank.amax(0) if svc.opts.reduce == "max" else per_rank.mean(0)
        for i, s in enumerate(finishing):
            if s.screening and s.split:  # each config was screened by one rank: its time is that rank's
                reduced[i] = per_rank[:, i].amin(0)
                s.screen_ms = reduced[i, : len(s.configs), 0].tolist()
            elif s.split:  # the dropped configs keep their one-rank screening times (no other rank ran them), and
                # the survivors that left the lockstep rounds their luckiest rank's (after the first, one rank's)
                for j in s.dropped | s.lockstep_out:
                    reduced[i, j] = per_rank[:, i, j].amin(0)
        for i, s in enumerate(finishing):
            if isinstance(s, KeyState) and s.incremental is not None:
                _carry_over(s, reduced[i], per_rank[:, i])
        # Rank 0 turns the reduced times into a keep-mask per state (a screening pass's survivors,
        # or a one-hot winner); broadcasting it makes every rank's schedule and choice identical.
        keep = torch.zeros((len(finishing), width), dtype=torch.int64)
        rungs: dict[int, dict[int, int]] = {}  # budgeted keys' next rungs, by row
        for i, s in enumerate(finishing):
            if s.forced:  # the call's budget is spent: the fastest of what was measured (search.force_decide)
                if (picked := self._forced_pick(s, reduced[i], per_rank[:, i])) is not None:
                    keep[i, picked[0]] = TIE_CODES[None] if picked[1] else FORCED_CHECK_CODE
                # (else no config is left to try: the row stays empty, and every rank raises below)
            elif isinstance(s, KeyState) and s.budget is not None and s.confirmed is None:
                # Rank 0's next rung (its own clock sizes it under a seconds budget), or the winner among the
                # finalists (re-timed end to end first where the key's unbudgeted search would confirm so, then
                # decided below like any confirmed key); the broadcast makes it every rank's.
                compared = self._times(s, reduced[i])
                rung = s.budget.next_rung(compared, time.perf_counter() - s.started, step_s, self._siblings(s))
                if rung:
                    rungs[i] = rung
                elif (choice := self._budget_choice(s, reduced[i], self._incumbent(s))) is not None:
                    finalists = [j for j in s.budget.pick_finalists(compared) if math.isfinite(compared[j])]
                    if len(finalists) > 1 and self._confirms_end_to_end(s):
                        keep[i, finalists] = CONFIRM_E2E_CODE
                    else:
                        keep[i, choice.winner] = TIE_CODES[choice.tie_break]
            elif s.screening and svc.early_stop:
                keep[i, screen(self._times(s, reduced[i]), self._screen_factor(s))] = 1
            elif isinstance(s, KeyState) and s.lockstep_left:
                keep[i, self._lockstep_stay(s, per_rank[:, i])] = LOCKSTEP_CODE
            elif readmit := self._to_readmit(s, reduced[i]):
                keep[i, readmit] = READMIT_CODE
            elif isinstance(s, KeyState) and s.confirm_left and len(stay := self._stay(s, reduced[i])) > 1:
                keep[i, stay] = RACE_CODE
            elif (choice := self._choice(s, reduced[i], self._incumbent(s))) is not None:
                close, end_to_end = self._to_confirm(s, choice, reduced[i], per_rank[:, i])
                if close:
                    keep[i, close] = CONFIRM_E2E_CODE if end_to_end else CONFIRM_CODE
                else:
                    keep[i, choice.winner] = TIE_CODES[choice.tie_break]
        for i, rung in self._share_waves(finishing, rungs).items():
            for j, timed in rung.items():
                keep[i, j] = BUDGET_CODE + timed
        keep = svc.comm.broadcast_from_root(keep, "broadcast decisions")
        for i in range(len(finishing)):
            if not bool(keep[i].any()):
                self._raise_no_valid_config(finishing, i)
        hold = svc.search.hold_screened_kernels()
        for i, s in enumerate(finishing):
            kept = keep[i, : len(s.configs)].nonzero().flatten().tolist()
            times = reduced[i, : len(s.configs), :3]  # (the fastest sample, column 3, is the race's alone)
            if isinstance(s, PointTunable):
                if s.screening:
                    # Even a single survivor gets its kernels' full tuning, then its timed steps.
                    s.screened = times[:, 0].tolist()
                    s.keep(kept)
                    for p in kept:
                        svc.search.resume_point(p)
                    self._log_screen(s, kept, times)
                else:
                    self._commit_point(s, kept[0], times, per_rank[:, i, : len(s.configs), 0])
            elif int(keep[i].max()) >= BUDGET_CODE:
                assert isinstance(s, KeyState) and s.budget is not None
                rung = {j: int(keep[i, j]) - BUDGET_CODE for j in kept}
                if hold and s.point is not None:
                    # Its first rung was its point's screening: the rest waits until the point survives, as a
                    # screened key's survivors do (search.hold_screened_kernels).
                    compared = self._times(s, times)
                    best = min(range(len(compared)), key=lambda j: (compared[j], j))
                    s.hold_rung(rung, best=best if math.isfinite(compared[best]) else (s.fallback(untried=True) or 0))
                else:
                    s.add_rung(rung)
                self._log_rung(s, kept, times)
            elif int(keep[i].max()) in (CONFIRM_CODE, CONFIRM_E2E_CODE):
                self._confirm(s, kept, times, end_to_end=int(keep[i].max()) == CONFIRM_E2E_CODE)
            elif int(keep[i].max()) == RACE_CODE:
                self._race(s, kept, times)
            elif int(keep[i].max()) == LOCKSTEP_CODE:
                assert isinstance(s, KeyState)
                self._lockstep_round(s, kept, per_rank[:, i, : len(s.configs), 3].amin(0))
            elif s.forced:  # the call's budget ran out: rank 0's pick, described like any decision
                assert isinstance(s, KeyState)  # (a forced PointTunable took the first branch)
                if int(keep[i, kept[0]]) == FORCED_CHECK_CODE:
                    # Not timed on every rank yet (a split screening's config ran on one): one lockstep round
                    # first, so that the winner is known to run everywhere; decided once it has run.
                    s.check_everywhere(kept)
                else:
                    self._commit(s, kept[0], times, per_rank[:, i, : len(s.configs), 0],
                                 self._choice(s, reduced[i], None), None)
            elif isinstance(s, KeyState) and s.budget is not None:
                finalists = s.budget.pick_finalists(self._times(s, reduced[i]))
                s.budget.finalists = finalists
                s.dropped = set(range(len(s.configs))) - set(finalists)
                _carry_prior(s, reduced[i], per_rank[:, i])
                choice = self._choice(s, reduced[i], None)
                self._commit(s, kept[0], times, per_rank[:, i, : len(s.configs), 0], choice,
                             TIE_BY_CODE.get(int(keep[i, kept[0]])))
            elif int(keep[i].max()) == READMIT_CODE:
                s.readmit(kept)
                self._log_readmit(s, kept, times)
            elif s.screening and (len(kept) > 1 or s.split):  # a split's one survivor is still timed by all
                if hold and s.point is not None:
                    s.hold(kept, best=min(kept, key=lambda j: float(times[j, 0])))
                else:
                    s.keep(kept)
                self._log_screen(s, kept, times)
            else:
                if s.screening:  # one survivor: it has won
                    s.dropped = set(range(len(s.configs))) - set(kept)
                    s.screening = False
                # Every rank describes the choice alike: band and spread from the reduced times, how from rank 0.
                choice = self._choice(s, reduced[i], None)
                how = TIE_BY_CODE.get(int(keep[i, kept[0]]))
                self._commit(s, kept[0], times, per_rank[:, i, : len(s.configs), 0], choice, how)
        self.release_confirmations()

    def _forced_pick(self, s: Tunable, reduced: torch.Tensor, per_rank: torch.Tensor) -> tuple[int, bool] | None:
        """Rank 0, once the call's budget is spent: (the winner, True), the fastest config (point) with a time on
        every rank; or (a config, False) to run once on every rank first, when none has one (a split screening
        times each config on one rank, and one that ran on one rank may fail on another). A point's screening
        time stands in where it took no sample since (its kernels were still tuning: both are call times); every
        point runs on every rank alike."""
        times = self._times(s, reduced)
        if isinstance(s, PointTunable):
            if s.screened:
                times = [t if math.isfinite(t) or j in s.dropped or j in s.failures else s.screened[j]
                         for j, t in enumerate(times)]
            finite = [j for j, t in enumerate(times) if math.isfinite(t)]
            usable = finite or [j for j in sorted(s.seen) if j not in s.failures] or \
                [j for j in range(len(s.configs)) if j not in s.failures]
            return min(usable, key=lambda j: (times[j], j)), True
        assert isinstance(s, KeyState)  # (the only other kind)
        n = len(s.configs)
        everywhere = per_rank[:, :n, 0].amax(0).tolist()  # (decide() made every missing time inf)
        open_ = [j for j, t in enumerate(times) if math.isfinite(t) or j in s.forced_checked]
        ran = [j for j in open_ if math.isfinite(everywhere[j])]
        if ran:
            return min(ran, key=lambda j: (everywhere[j], j)), True
        somewhere = per_rank[:, :n, 0].amin(0).tolist()
        luck = [j for j in range(n) if math.isfinite(somewhere[j]) and j not in s.forced_checked
                and j not in s.dropped]
        if luck:
            return min(luck, key=lambda j: (somewhere[j], j)), False
        untried = [j for j in range(n) if j not in s.forced_checked and j not in s.dropped]
        return (untried[0], False) if untried else None

    def _to_readmit(self, s: Tunable, reduced: torch.Tensor) -> list[int]:
        """Rank 0, after a split screening's survivors were timed in lockstep: the dropped configs whose
        one-rank screening time is within early_stop of the lockstep winner's time (any finite one when no
        survivor has a time). A config fast on its screening rank only has a lockstep time that shows it;
        the configs it pushed out come back."""
        factor = self.services.early_stop
        if not s.split or s.screening or s.screen_ms is None or factor is None:
            return []
        limit = factor * _lockstep_best(s, reduced)
        return [j for j in sorted(s.dropped)
                if math.isfinite(s.screen_ms[j]) and s.screen_ms[j] <= limit and j not in s.readmitted]

    def _budget_choice(self, s: KeyState, reduced: torch.Tensor, incumbent: int | None) -> Choice | None:
        """The winner of a budgeted search: the near-tie rule among its finalists (budget.pick_finalists)."""
        assert s.budget is not None
        finalists = set(s.budget.pick_finalists(self._times(s, reduced)))
        n = len(s.configs)
        times = [t if j in finalists else math.inf for j, t in enumerate(self._times(s, reduced))]
        return stable_winner(times, reduced[:n, 1].tolist(), reduced[:n, 2].tolist(), incumbent)

    def _log_rung(self, s: KeyState, kept: list[int], times: torch.Tensor) -> None:
        svc = self.services
        b = s.budget
        assert b is not None
        new = [j for j in kept if j in b.rungs[-1] and not any(j in r for r in b.rungs[:-1])
               and (b.prior is None or j not in b.prior.explored)]
        finite = [(float(times[j, 0]), j) for j in range(len(s.configs)) if math.isfinite(float(times[j, 0]))]
        best = min(finite) if finite else None
        spent = b.spent(time.perf_counter() - s.started)
        svc.log.write("rung", f"rung {_subject(s)} #{len(b.rungs) - 1}: {len(kept)} configs ({len(new)} new), "
                      f"explored {len(b.launched)}/{len(s.configs)}, {b.slots} slots; budget {b.limit:g} {b.measure}, "
                      f"spent {spent[b.measure]:g}"
                      + (f"; best so far config#{best[1]} {fmt_ms(best[0])}" if best else "")
                      + (f"; {b.wave['left_out']} configs left out: with the other keys' rungs of this step it brings "
                         f"{b.wave['binaries']} new binaries, what the budgets pay for ({b.wave['cap']}); it takes "
                         f"{b.wave['taken']} of the other keys' new binaries instead"
                         if b.wave and b.wave["left_out"] else ""),
                      **_subject_fields(s), rung=len(b.rungs) - 1, configs=kept, new=new, slots=b.slots,
                      explored=len(b.launched), measure=b.measure, limit=b.limit, spent=spent,
                      best=None if best is None else best[1], wave=b.wave)
        b.wave = None

    def _log_readmit(self, s: Tunable, kept: list[int], times: torch.Tensor) -> None:
        svc = self.services
        best = _lockstep_best(s, times, also_dropped=kept)
        assert s.screen_ms is not None
        svc.log.write("readmit", f"readmit {_subject(s)}: configs {kept} (screened at "
                      f"{', '.join(fmt_ms(s.screen_ms[j]) for j in kept)} on one rank) are within {svc.early_stop:g}x "
                      f"of the lockstep best, {fmt_ms(best)}: timed in lockstep too",
                      **_subject_fields(s), configs=kept, screen_ms=[s.screen_ms[j] for j in kept],
                      lockstep_best=best if math.isfinite(best) else None, factor=svc.early_stop)

    def _to_confirm(self, s: Tunable, choice: Choice, reduced: torch.Tensor,
                    per_rank: torch.Tensor) -> tuple[list[int], bool]:
        """Rank 0: the close candidates a key re-times before its decision ([] to decide now), and whether
        end to end. Once per key, for keys timed per launch, and only configs measured in this call
        (carried-over times have no samples to compare). A key that overlapped another stream's work
        (objective "auto", re-execution: an end-to-end sample is a whole step) is confirmed on the call's
        time, as objective="end_to_end" would judge it, but for its few close candidates only. Rank 0's
        own view of the overlap decides, for every rank.

        A kernel key of a function-level point (autotune()) is confirmed end to end too, overlapped or not:
        the point it serves is judged by the call's time, so its kernels are decided by the same rule, and
        a config that is fastest alone but slows what the point overlaps it with (a GEMM beside the point's
        all-gather) cannot cost its point the decision (issue 35, docs/function-spaces.md)."""
        opts = self.services.opts
        if not (isinstance(s, KeyState) and opts.resolved_confirm()) or s.confirmed is not None or s.end_to_end:
            return [], False
        end_to_end = self._confirms_end_to_end(s)
        times = self._times(s, reduced)
        # Each config's time on its luckiest rank (the ones _times rules out stay out).
        luckiest = [math.inf if math.isinf(t) else u for t, u in zip(times, per_rank[:, : len(s.configs), 0]
                                                                      .amin(0).tolist())]
        elsewhere = self._elsewhere(s) if end_to_end else None
        close, _ = close_candidates(choice, times, overlapped=end_to_end, luckiest=luckiest, elsewhere=elsewhere)
        close = [j for j in close if j not in s.carried]
        return (close, end_to_end) if len(close) > 1 else ([], False)

    def _stay(self, s: KeyState, reduced: torch.Tensor) -> list[int]:
        """The candidates of a confirmation's race within RACE_BAND of its fastest so far."""
        times = self._times(s, reduced)
        racing = [j for j in s.racing() if math.isfinite(times[j])]
        best = min((times[j] for j in racing), default=math.inf)
        return [j for j in racing if times[j] <= best * (1 + RACE_BAND)]

    def _race(self, s: Tunable, stay: list[int], times: torch.Tensor) -> None:
        racing = s.racing()
        s.race(stay)
        out = [j for j in racing if j not in stay]
        best = min(float(times[j, 0]) for j in stay)
        self.services.log.write(
            "confirm-round", f"confirm {_subject(s)}: {len(stay)} of {len(racing)} candidates stay in the race "
            f"{stay}" + (f"; {out} more than {RACE_BAND:.0%} behind the fastest, {fmt_ms(best)}" if out else ""),
            **_subject_fields(s), stay=stay, out=out, reduced=[float(times[j, 0]) for j in racing],
            rounds_left=s.confirm_left)

    def _lockstep_stay(self, s: KeyState, per_rank: torch.Tensor) -> list[int]:
        """Rank 0, after a round of a screening's survivors (state.keep): those that stay for the next round.

        Each survivor is judged by its fastest sample, on its luckiest rank (after a split screening's first round
        only the rank that screened it has timed it): one more than RACE_BAND behind the fastest leaves. Its fastest
        sample, since a slow one (a clock ramp, a neighbour's launch) must not send a near-tie away: the MLP op's
        GEMM #14 once had 0.410 and 0.319 ms beside #13's 0.318, and an FLA key's winner 0.035 and 0.209 ms, 1.9x
        behind by the 20th percentile of the two. Replayed on the committed logs of 1 and 2 H200s from before the
        race (159 screened keys, 128 of them split; 1230 survivors), 518 would have left after the first
        round, and every winner and config within 1% of its key's winner was at most 6.4% behind there; on
        section 49's own runs (184 keys), at most 3.4% (benchmarks/replay_lockstep_race.py, RESULTS.md
        section 49). Anchors stay (incremental.py scales the carried times with theirs), and so does every
        survivor of a key whose per-launch time may not be what counts: one that overlapped another stream's
        work, or whose close candidates are confirmed end to end (_to_confirm)."""
        if s.overlapped or self._confirms_end_to_end(s):
            return list(s.lockstep)
        luck = per_rank[:, : len(s.configs), 3].amin(0).tolist()
        best = min((luck[j] for j in s.lockstep), default=math.inf)
        if not math.isfinite(best):
            return list(s.lockstep)
        return [j for j in s.lockstep if luck[j] <= best * (1 + RACE_BAND) or j in s.anchors]

    def _lockstep_round(self, s: KeyState, stay: list[int], luckiest: torch.Tensor) -> None:
        before = list(s.lockstep)
        s.next_lockstep_round(stay)
        out = [j for j in before if j not in stay]
        if not out:
            return
        best = min(float(luckiest[j]) for j in stay)
        self.services.log.write(
            "lockstep-round", f"survivors {_subject(s)}: {len(stay)} of {len(before)} stay for the next "
            f"round {stay}; {out} more than {RACE_BAND:.0%} behind the fastest, {fmt_ms(best)}, on their luckiest "
            "rank", **_subject_fields(s), stay=stay, out=out, luckiest=[float(luckiest[j]) for j in before],
            rounds_left=s.lockstep_left)

    def _share_waves(self, finishing: list[AnyTunable], rungs: dict[int, dict[int, int]]) -> dict[int, dict[int, int]]:
        """Rank 0: the exploring rungs of several seconds-budgeted keys of one kernel, decided in this step, cut to the
        new binaries their budgets pay for together (budget.share_wave): they compile in one step, where each key
        priced its own rung alone. The cap is the most constrained key's explorable configs. Other ranks' rungs are
        replaced by the broadcast: they leave them, and their logs say nothing of a cut they did not make."""
        if self.services.comm.rank != 0:
            return rungs
        groups: dict[tuple[int, ...], list[tuple[int, KeyState, BudgetSearch]]] = {}
        for i in rungs:
            s = finishing[i]
            assert isinstance(s, KeyState) and s.budget is not None
            if s.budget.phase == "explore" and s.budget.measure == "seconds" and s.budget.parallel > 1:
                groups.setdefault(s.config_ids, []).append((i, s, s.budget))
        out = dict(rungs)
        now = time.perf_counter()
        for group in (group for group in groups.values() if len(group) > 1):
            ids = group[0][1].config_ids  # a config index names the same binary only in the same config list
            compiled = set().union(*(o.budget.launched for o in self.services.search.kernels.values()
                                     if o.budget is not None and o.config_ids == ids))
            cap = max(min(search.explorable_now(now - s.started) for _, s, search in group), 2)
            cut, binaries = share_wave([rungs[i] for i, _, _ in group], [search.launched for _, _, search in group],
                                       compiled, cap, [set(search.unexplored()) for _, _, search in group])
            for (i, _, search), rung in zip(group, cut):
                search.wave = {"rungs": len(group), "binaries": binaries, "cap": cap,
                               "left_out": len(rungs[i].keys() - rung.keys()),
                               "taken": len(rung.keys() - rungs[i].keys())}
                out[i] = rung
        return out

    def _peer_times(self, s: KeyState, peer: Callable[[KeyState], bool]) -> Iterator[list[float]]:
        """Rank 0's per-launch times (KeyState.launch_times) of the other keys of s's kernel, with s's configs, that
        `peer` accepts. Only rank 0's reading matters: the decisions it makes from them are broadcast."""
        for other in self.services.search.kernels.values():
            if other is not s and other.autotuner is s.autotuner and len(other.configs) == len(s.configs) \
                    and peer(other) and (times := other.launch_times(self.services.opts.stat)) is not None:
                yield times

    def _elsewhere(self, s: KeyState) -> list[float] | None:
        """Rank 0: each config's fastest time per launch for the same kernel and key under the function's other
        points (close_candidates: beside overlapped work, per-launch times hide the config that overlaps best)."""
        out: list[float] | None = None
        for times in self._peer_times(s, lambda other: other.key == s.key):
            out = times if out is None else [min(a, b) for a, b in zip(out, times)]
        return out

    def _siblings(self, s: KeyState) -> list[int]:
        """Rank 0: the configs other budgeted keys of the same kernel (and point) ran within PARENT_BAND of their
        fastest, by that ratio, best first (budget.SIBLING_PICKS)."""
        ratio: dict[int, float] = {}
        for times in self._peer_times(s, lambda other: other.budget is not None and other.point == s.point):
            fastest = min(times, default=math.inf)
            for j, t in enumerate(times):
                if math.isfinite(t) and t <= PARENT_BAND * fastest:
                    ratio[j] = min(ratio.get(j, math.inf), t / fastest)
        return sorted(ratio, key=lambda j: (ratio[j], j))

    def _screen_factor(self, s: Tunable) -> float:
        """early_stop, or for a kernel key of a function-level point at least POINT_SCREEN: its one-sample
        per-launch screening says little of the call's time beside what the point overlaps (all-gather + GEMM:
        a config 1.6x slower per launch than the fastest was within 4% of the best call; issue 35)."""
        factor = float(self.services.early_stop or 0.0)  # (called where early_stop is set)
        if isinstance(s, KeyState) and s.point is not None and self.services.search.points is not None \
                and self._confirms_end_to_end(s):
            return max(factor, POINT_SCREEN)
        return factor

    def _confirms_end_to_end(self, s: KeyState) -> bool:
        """Whether the key's close candidates (a budgeted search's finalists) are re-timed as whole steps: it
        overlapped another stream's work, or it serves a function-level point (see _to_confirm)."""
        opts = self.services.opts
        in_point = s.point is not None and self.services.search.points is not None
        return ((s.overlapped or in_point) and opts.objective == "auto" and not opts.online and not opts.cuda_graph
                and opts.resolved_confirm())

    def _confirm(self, s: Tunable, kept: list[int], times: torch.Tensor, end_to_end: bool) -> None:
        svc = self.services
        # End to end, a round is a step of e2e_runs executions (e2e_runs - 1 samples each): CONFIRM_ROUNDS suffice.
        # Per launch, a noisy key takes more rounds (confirm_rounds), sized from the reduced times every rank has;
        # not online, where each slot is one of the program's calls and a key decides within a known number of them.
        n = len(s.configs)
        kept_only = [float(times[j, 0]) if j in kept else math.inf for j in range(n)]
        spread = fastest_spread(kept_only, times[:n, 1].tolist(), times[:n, 2].tolist()) or 0.0
        base = max(CONFIRM_ROUNDS, s.n_repeat)
        if end_to_end:
            rounds = CONFIRM_ROUNDS
        else:
            rounds = base if svc.opts.online else confirm_rounds(spread, base)
        best = min(float(times[j, 0]) for j in kept)
        margins = {j: float(times[j, 0]) / best - 1 for j in kept}
        waits = [] if end_to_end or svc.opts.online else self._varying_before(s)
        if waits:
            assert isinstance(s, KeyState)
            s.confirm_after(kept, rounds, min(kept, key=lambda j: (float(times[j, 0]), j)), waits)
        else:
            s.confirm(kept, rounds, end_to_end)
        how = "end to end (it overlapped another stream's work)" if end_to_end else "per launch"
        after = f", once {', '.join(_subject(u) for u in waits)} no longer change config" if waits else ""
        svc.log.write("confirm", f"confirm {_subject(s)}: {len(kept)} close candidates {kept} "
                      f"(within {max(margins.values()):.1%} of the fastest) re-timed interleaved, {how}, {rounds} "
                      f"more slots each{after}", **_subject_fields(s), candidates=kept, rounds=rounds,
                      reduced=[float(times[j, 0]) for j in kept], margins=[margins[j] for j in kept],
                      end_to_end=end_to_end, waits_for=[_subject(u) for u in waits])

    def _varying_before(self, s: Tunable) -> list[KeyState]:
        """The keys met before `s` (in every rank's order) whose config still changes from step to step: screening,
        timing survivors, or a budget's rungs. Re-timed among them, `s`'s candidates would each run after other
        configs of theirs: on the MLP op, GELU's candidates ran after GEMM configs up to 30% apart, each candidate
        after its own few of them, and which GEMM config ran before it decided whether BLOCK 1024 was level with
        2048 or 1.8% behind (RESULTS.md section 43). A key still compiling runs one ready config (not a change),
        and one confirming runs candidates close to each other: neither is waited for. Not within a function space
        (points confirm end to end)."""
        if not isinstance(s, KeyState) or s.point is not None:
            return []
        before: list[KeyState] = []
        for u in self.services.search.kernels.values():
            if u is s:
                break
            if u.point == s.point and _varies(u):
                before.append(u)
        return before

    def release_confirmations(self) -> None:
        """The step's end, after its decisions (agreed on every rank): confirmations whose keys before them settled
        are planned now."""
        for s in self.services.search.kernels.values():
            if s.confirm_waits is not None and not any(_varies(u) for u in s.confirm_waits):
                s.release_confirmation()

    @staticmethod
    def _times(s: Tunable, reduced: torch.Tensor) -> list[float]:
        """The configs' times a decision compares: a config screened out has none, and once a key re-timed its close
        candidates only they compete. Their fresh samples are whole steps when confirmed end to end, and a
        config that was not re-timed keeps a per-launch time, which would compare a kernel's span with the
        call's (issue 35: on all-gather + GEMM the winner was the config left out of the confirmation)."""
        # A point is judged on its slow fifth (q80), not its median: a point whose overlap works only some of the
        # time (all-gather + GEMM with the gather on a side stream of no priority: 0.607 ms in its fastest fifth,
        # 0.664 in its slowest, 0.673 in every later call) won on a lucky median over a steady 0.627 (issue 35).
        column = POINT_STAT if isinstance(s, PointTunable) and not s.screening else 0
        out = reduced[: len(s.configs), column].tolist()
        confirmed = None if not isinstance(s, KeyState) or s.confirmed is None else set(s.confirmed)
        return [math.inf if j in s.dropped or j in s.raced_out or (confirmed is not None and j not in confirmed)
                else t for j, t in enumerate(out)]

    def _choice(self, s: Tunable, reduced: torch.Tensor, incumbent: int | None) -> Choice | None:
        n = len(s.configs)
        # Confirmed per launch: each time is a statistic of that many interleaved rounds (0 otherwise).
        rounds = s.confirmed_rounds if isinstance(s, KeyState) and s.confirmed is not None else 0
        return stable_winner(self._times(s, reduced), reduced[:n, 1].tolist(), reduced[:n, 2].tolist(), incumbent,
                             samples=max(1, rounds))

    def _incumbent(self, s: Tunable) -> int | None:
        """The config that last won this kernel and key, from the cache entry that no longer applies
        (a new Triton, a changed config list), as read by rank 0, the rank that chooses."""
        lookup = self.services.misses.get(id(s))
        won = None if lookup is None or lookup.stale is None else lookup.stale.winner_config
        names = [config_str(c) for c in s.configs] if won is not None and isinstance(s, KeyState) else []
        return names.index(won) if won in names else None

    def _log_screen(self, s: Tunable, kept: list[int], times: torch.Tensor) -> None:
        svc = self.services
        what = _subject(s)
        held = " (held until its point survives)" if s.held is not None else ""
        factor = self._screen_factor(s) if svc.early_stop else svc.early_stop
        svc.log.write("screen", f"screen {what} kept {len(kept)}/{len(s.configs)} "
                      f"configs within {factor:g}x of the best: {kept}{held}", **_subject_fields(s),
                      kept=kept, factor=factor, reduced=times[:, 0].tolist(), held=s.held is not None,
                      split=s.split)

    def _commit_point(self, pts: PointTunable, winner: int, reduced: torch.Tensor, per_rank: torch.Tensor) -> None:
        svc = self.services
        pts.winner = winner
        pts.tuning_s = time.perf_counter() - pts.started
        kernels = svc.search.of_point(winner)
        for s in kernels:
            if s.winner is not None:  # decided: other points may have put their own winners of the same key there
                s.autotuner.cache[s.key] = s.configs[s.winner]
            elif s.held is not None:
                s.resume()
        svc.stats.point = dict(pts.configs[winner])
        times = reduced[:, POINT_STAT].tolist()  # (a screened-out point's from its screening: the margin's runner-up)
        finite = sorted(t for j, t in enumerate(times) if math.isfinite(t) and j != winner)
        margin = finite[0] / times[winner] - 1 if finite and times[winner] > 0 else None
        how = f"{svc.opts.reduce} over {svc.comm.world} ranks" if svc.comm.world > 1 else "1 rank"
        svc.log.write("point-decision", f"point-decision function={svc.function} winner=point#{winner} "
                      f"{pts.configs[winner]} {fmt_ms(times[winner])} end to end (q80, {how}); "
                      f"compared=[{', '.join(f'{t:.4f}' for t in times)}]",
                      function=svc.function, winner=winner, points=[plain_point(p) for p in pts.configs],
                      compared=times, reduced=reduced[:, 0].tolist(), reduced_q20=reduced[:, 1].tolist(),
                      reduced_q80=reduced[:, 2].tolist(),
                      per_rank=per_rank.tolist(), margin=margin, screened_out=sorted(pts.dropped),
                      failures={str(k): v for k, v in pts.failures.items()},
                      kernels=[{"kernel": s.kernel, "key": list(s.key), "winner": s.winner,
                                "config": None if s.winner is None else config_str(s.configs[s.winner])}
                               for s in kernels],
                      reduce=svc.opts.reduce, stat=svc.opts.stat, world=svc.comm.world,
                      executions=svc.stats.executions, tuning_s=pts.tuning_s)
        svc.log.summary(f"{svc.function}: point {pts.configs[winner]} -> {fmt_ms(times[winner])} end to end (q80) "
                        f"({len(pts.configs)} points, {len(pts.failures)} failed, {len(pts.dropped)} screened out, "
                        f"{how}, {pts.tuning_s:.2f} s)")
        svc.point_decided({"winner": winner, "reduced": reduced.tolist(), "per_rank": per_rank.tolist()})

    def _commit(self, s: KeyState, winner: int, reduced: torch.Tensor, per_rank: torch.Tensor,
                choice: Choice | None = None, how: str | None = None) -> None:
        svc = self.services
        at = s.autotuner
        s.winner = winner
        s.tuning_s = time.perf_counter() - s.started
        best = s.configs[winner]
        at.cache[s.key] = best
        at.best_config = best
        at.configs_timings = {c: reduced[j].tolist() for j, c in enumerate(s.configs)}
        at.bench_time = s.tuning_s
        notify_listener(at, s.key, best, at.configs_timings, s.tuning_s)
        ms = float(reduced[winner, 0])
        same = sum(1 for r in s.failures.values() if same_binary(r))  # timed as another config, not failed
        failed = sum(1 for t in reduced[:, 0].tolist() if not math.isfinite(t)) - same
        svc.stats.tuned.append(TunedKey(s.kernel, s.key, config_str(best), ms, len(s.configs), failed, s.point))
        over = f"{svc.opts.reduce} over {svc.comm.world} ranks" if svc.comm.world > 1 else "1 rank"
        tie = "" if choice is None or how is None else (
            f"; tie-break ({how}) among configs {choice.ties} within {choice.band:.1%} of the fastest, "
            f"config#{choice.fastest} {fmt_ms(float(reduced[choice.fastest, 0]))}")
        svc.log.write("decision",
                      f"decision kernel={s.kernel} key={s.key!r} winner=config#{winner} {{{config_str(best)}}} "
                      f"{fmt_ms(ms)} ({svc.opts.stat}, {over}){tie}; "
                      f"reduced=[{', '.join(f'{t:.4f}' for t in reduced[:, 0].tolist())}]",
                      kernel=s.kernel, key=list(s.key), point=s.point, end_to_end=s.end_to_end,
                      winner=winner, winner_config=config_str(best),
                      configs=[config_str(c) for c in s.configs], reduced=reduced[:, 0].tolist(),
                      reduced_q20=reduced[:, 1].tolist(), reduced_q80=reduced[:, 2].tolist(),
                      per_rank=per_rank.tolist(), local_failures={str(k): v for k, v in s.failures.items()},
                      screened_out=sorted(s.dropped),
                      reduce=svc.opts.reduce, stat=svc.opts.stat, world=svc.comm.world,
                      executions=svc.stats.executions, tuning_s=s.tuning_s,
                      fastest=None if choice is None else choice.fastest, ties=None if choice is None else choice.ties,
                      band=None if choice is None else choice.band, spread=None if choice is None else choice.spread,
                      tie_break=how, confirmed=s.confirmed, confirm_rounds=s.confirmed_rounds or None,
                      raced_out=sorted(s.raced_out), split=s.split,
                      readmitted=s.readmitted, unexplored=_unexplored(s))
        alike = f"{same} the same binary as another, " if same else ""
        raced = f"{len(s.lockstep_out)} left the survivors' race, " if s.lockstep_out else ""
        svc.log.summary(f"{svc.function}: {s.kernel} key={s.key!r} -> {{{config_str(best)}}} {fmt_ms(ms)} "
                        f"({len(s.configs)} configs, {failed} failed, {alike}{len(s.dropped)} screened out, {raced}"
                        f"{over}, {s.tuning_s:.2f} s)")
        incremental = self._log_incremental(s) if s.incremental is not None else {}
        lookup = svc.misses.pop(id(s), None)
        if lookup is not None and svc.cache is not None:
            path = svc.cache.store(lookup, s.configs, winner, reduced.tolist(), per_rank.tolist(), dict(s.failures),
                                   {"function": svc.function, "executions": svc.stats.executions,
                                    "tuning_s": s.tuning_s, "n_warmup": s.n_warmup, "n_repeat": s.n_repeat,
                                    "split": s.split, "screened_out": sorted(s.dropped),
                                    "lockstep_out": sorted(s.lockstep_out), **incremental,
                                    **self._budget_record(s)},
                                   carried=s.incremental.carried if s.incremental is not None else
                                   _budget_carried(s))
            if path is not None:
                svc.stats.stored.append(str(path))
                svc.log.write("cache-store", f"cache-store kernel={s.kernel} key={s.key!r} -> {path}",
                              kernel=s.kernel, key=list(s.key), path=str(path), id=lookup.id)

    def _budget_record(self, s: KeyState) -> dict[str, Any]:
        """What a budgeted search explored and spent, for the cache entry (a larger budget continues from it)."""
        b = s.budget
        if b is None:
            return {}
        explored = b.launched | (b.prior.explored if b.prior is not None else set())
        whole = len(explored | set(s.failures)) >= len(s.configs)
        return {"budget": b.record(s.tuning_s, decided_by_budget=not whole)}

    def _log_incremental(self, s: KeyState) -> dict[str, Any]:
        """Say what was re-timed and what carried over; the part the cache entry keeps (its "tuned")."""
        p = s.incremental
        assert p is not None
        new, anchors, carried, failed = p.new, p.anchors, p.carried, p.carried_failed
        scale = "none: no anchor has a time now, so the carried configs were left out" if s.scale is None else \
            f"{s.scale:.3f}"
        self.services.log.write(
            "incremental", f"incremental kernel={s.kernel} key={s.key!r}: timed {len(new)} new {new} + "
            f"{len(anchors)} anchors {anchors} of {len(s.configs)}, carried {len(carried)} {carried}"
            + (f" and {len(failed)} failed {failed}" if failed else "") + f" ({p.removed} left the list), "
            f"scale {scale}", kernel=s.kernel, key=list(s.key), configs=len(s.configs), new=new, anchors=anchors,
            carried=carried, carried_failed=failed, removed=p.removed, scale=s.scale)
        return {"incremental": {"new": new, "anchors": anchors, "carried": carried, "carried_failed": failed,
                                "removed": p.removed, "scale": s.scale}}

    def _raise_no_valid_config(self, finishing: list[AnyTunable], i: int) -> None:
        svc = self.services
        # Every rank reaches this with the same broadcast winners, so the extra gather is safe.
        mine = {str(i): {str(c): r for c, r in s.failures.items()} for i, s in enumerate(finishing)}
        everyone = [json.loads(b) for b in svc.comm.all_gather_bytes(json.dumps(mine).encode(), "share failures")]
        s = finishing[i]
        failures: dict[str, list[str]] = {}
        for j, config in enumerate(s.configs):
            reasons = [f"rank {r}: {e[str(i)][str(j)]}" for r, e in enumerate(everyone) if str(j) in e[str(i)]]
            text = config_str(config) if isinstance(s, KeyState) else repr(config)
            failures[text] = reasons or ["no failure recorded, but no finite time either"]
        svc.log.write("error", f"no valid config for {_subject(s)}", **_subject_fields(s), failures=failures)
        if isinstance(s, KeyState):
            raise NoValidConfigError(s.kernel, s.key, failures)
        raise NoValidPointError(svc.function, failures)


def _varies(s: KeyState) -> bool:
    """Whether a key's launches may run another config in the next step than in this one."""
    return (s.winner is None and not s.settled and s.confirmed is None and s.compiling is None
            and not s.end_to_end)


def _lockstep_best(s: Tunable, reduced: torch.Tensor, also_dropped: Iterable[int] = ()) -> float:
    """The fastest time among the configs a split screening kept (`also_dropped`: configs readmitted just
    now, still counted as dropped); inf when none has one."""
    out = set(s.dropped) | set(also_dropped)
    return min((t for j, t in enumerate(reduced[: len(s.configs), 0].tolist()) if j not in out), default=math.inf)


def _carry_over(s: KeyState, reduced: torch.Tensor, per_rank: torch.Tensor) -> None:
    """Put a key's carried configs' old times, scaled by its anchors' new/old ratio, among the times just
    reduced (in place), so the decision and the stored entry cover every live config. Every rank holds the
    same plan and reduced times, so every rank fills in the same numbers."""
    assert s.incremental is not None
    s.scale = s.incremental.scale(reduced[: len(s.configs), 0].tolist())
    if s.scale is None:
        return  # nothing to put them on today's scale with: they stay without a time
    for j, (stats, ranks) in s.incremental.carried_times(s.scale).items():
        reduced[j, :3] = torch.tensor(stats, dtype=reduced.dtype)
        per_rank[:, j, 0] = torch.tensor(ranks, dtype=per_rank.dtype)


def _unexplored(s: KeyState) -> list[int]:
    """The configs a budgeted search never ran (nor an earlier run it continued)."""
    b = s.budget
    if b is None:
        return []
    seen = b.launched | (b.prior.explored if b.prior is not None else set())
    return [j for j in range(len(s.configs)) if j not in seen]


def _budget_carried(s: KeyState) -> set[int]:
    b = s.budget
    return set() if b is None or b.prior is None else b.prior.explored - b.launched


def _carry_prior(s: KeyState, reduced: torch.Tensor, per_rank: torch.Tensor) -> None:
    """A continued budgeted search: the earlier run's explored configs not re-timed now keep their times,
    on this run's scale (the anchors'), so the entry it stores covers everything explored so far."""
    b = s.budget
    assert b is not None
    if b.prior is None:
        return
    now = b.current_times(reduced[: len(s.configs), 0].tolist())
    for j in b.prior.explored - b.launched:
        if math.isfinite(now[j]):
            reduced[j] = torch.tensor([now[j]] * 4, dtype=reduced.dtype)
            per_rank[:, j, 0] = now[j]


def plain_point(point: dict[str, Any]) -> dict[str, Any]:
    return {str(k): v if isinstance(v, (bool, int, float, str, type(None))) else repr(v) for k, v in point.items()}


def _subject(s: Tunable) -> str:
    if isinstance(s, KeyState):
        return f"kernel={s.kernel} key={s.key!r}" + ("" if s.point is None else f" point#{s.point}")
    return f"function={s.function}" if isinstance(s, PointTunable) else repr(s)


def _subject_fields(s: Tunable) -> dict[str, Any]:
    if isinstance(s, KeyState):
        return {"kernel": s.kernel, "key": list(s.key), "point": s.point}
    return {"function": getattr(s, "function", None), "kind": "point"}
