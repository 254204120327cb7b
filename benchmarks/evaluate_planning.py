# SPDX-License-Identifier: Apache-2.0
"""Trace-driven evaluation of planning policies on machine profiles (seconds, not hours).

``python -m benchmarks.evaluate_planning results/engines/<run> ... --out <new folder>``
reads the traces a
``bench_engines`` run recorded through the node: per held-out item and resident option,
the loose run's answer (its length and token-F1 to float32's), admission, prefill and
decode seconds, and the length AUTO's predictor gave. It replays every strategy at every
tier against a machine profile, in the spirit of Vidur's simulator for LLM serving:

* a fixed choice meets a budget when its trace, with prefill and decode scaled to the
  machine, ends by it (Kill otherwise);
* AUTO is the node's own planner (``core.planning.TimeBillPlanner``, shipped settings,
  cut effects and length distribution) on the options' profiled ETEs scaled the same
  way, given the item's recorded prediction and the time left after its admission; the
  option it picks then runs as that option's trace.

Machine profiles scale each option's prefill and decode relative to the machine the
traces came from. ``traced`` is that machine (factor 1): its predicted met counts are
checked against the ones measured through the node (the report gives the gap per tier
in points). ``amd-epyc-2c`` and ``intel-xeon-2c`` are measured: bench_engines runs on
each (MEASURED, averaged) give each option's seconds there for this run's prompt and
answer lengths. ``jetson-orin-nano`` is from published figures and assumptions (its source
says which). A tier relative to float32's time is relative to float32's time on the
profile's machine. Writes evaluation.json and EVALUATION.md per run into a new folder
(runs are never overwritten).
"""

from __future__ import annotations

import argparse
import bisect
from dataclasses import dataclass, replace
import json
import math
from pathlib import Path
import re
import statistics
import sys
import time

from benchmarks import common, harness
from benchmarks.paths import REPO
from benchmarks.evaluate_tables import (
    cross_markdown, gap_points, markdown, paired, paired_markdown, pooled, pooled_markdown,
    pooled_profiles, profiles_markdown, repeatability, within_spread)
from timebill_ros.core.cut_kinds import handover_of
from timebill_ros.core.length import observed_distribution
from timebill_ros.core.config import NodeConfig
from timebill_ros.core.timing import held_prefix, reusable_prefix
from timebill_ros.evaluation import metrics

# Option traces by the name the planner gives them (Plan.precision; '' = float32).
TRACE_OF = {'': 'float32', 'int8-weight': 'int8-weight', 'int8-dynamic': 'int8-dynamic'}
CACHED = re.compile(r'(\d+) of (\d+) prompt tokens (in the prefix cache|held by)')


@dataclass(frozen=True)
class Machine:
    """Per-option (prefill, decode) time factors relative to the traced machine."""

    name: str
    source: str
    factors: dict  # option -> (prefill factor, decode factor); missing: (1, 1)
    unavailable: tuple = ()  # options this machine cannot run

    def factor(self, option: str) -> tuple:
        """Return an option's (prefill, decode) factors.

        A hand-over ('a>b') prefills as ``a`` and decodes as ``b``; an eviction ratio
        ('alpha 0.5') runs on float32 unless the profile names it.
        """
        if '>' in option:
            first, then = option.split('>', 1)
            return self.factor(first)[0], self.factor(then)[1]
        if option not in self.factors and option.startswith('alpha '):
            option = 'float32'
        return self.factors.get(option, (1.0, 1.0))


TRACED = 'traced'  # the profile of the machine the traces came from (factor 1)
# Machines measured through the node: bench_engines runs on each (their per-option step
# and prefill times, as calibrated at their start and corrected by their traces' drift),
# pooled: one run carries its VM's mood of the day (run 21's Q4_1 steps were 18 ms, runs
# 22 and 23 on the same kind 12 and 14 ms). Run 22 is left out of Intel's: it is the
# cross-check no profile was fitted on (results/engines/cross_xeon_seed17).
MEASURED = {
    'amd-epyc-2c': (('results/engines/robot_20_fresh_seed17',),
                    'run 20, 2-core AMD EPYC VM'),
    'intel-xeon-2c': (('results/engines/robot_10_xeon_seed19',
                       'results/engines/robot_10_xeon_seed23',
                       'results/engines/robot_10_xeon_seed29',
                       'results/engines/robot_10_xeon_seed31'),
                      'runs 21, 23, 24 and 25, 2-core Intel Xeon (Sapphire Rapids, AMX) VM'),
}


def measured_machine(name: str, there, here: 'Replay', source: str) -> Machine:
    """Return a profile from runs measured on another machine (``there``: Replays).

    Per option, its seconds there over its seconds here for the traced run's own prompt
    and answer lengths (float32's loose answers): each run's calibrated profile times what
    its traces drifted from it, the runs there averaged. Options not traced in every run
    there are left out (unavailable).
    """
    there = [there] if isinstance(there, Replay) else list(there)
    shapes = [(t['prompt_tokens'], t['tokens']) for (_, s), t in here.raw.items()
              if s == 'float32']

    def seconds(run: 'Replay', option: str) -> tuple:
        model, drift = run.models[option], run.drift.get(option, (1.0, 1.0))
        return (sum(model.prefill(n) for n, _ in shapes) * drift[0],
                sum(model.decode(n, k) for n, k in shapes) * drift[1])
    factors = {}
    for option in here.models:
        if not all(option in run.models for run in there):
            continue
        near = seconds(here, option)
        far = [seconds(run, option) for run in there]
        factors[option] = tuple(statistics.fmean(f[i] for f in far) / near[i]
                                for i in (0, 1))
    missing = tuple(o for o in here.models if o not in factors)
    return Machine(name, f'measured through the node: {source}', factors, missing)


def machines(replay: 'Replay', measured: dict | None = None) -> list:
    """Return the machine profiles a run is replayed on.

    ``measured``: name -> (bench_engines folders, what they are) of machines measured through
    the node (default MEASURED, the shipped runs); the traced machine itself first.
    """
    traced_steps = replay.steps
    f32 = traced_steps['float32']

    def decode_to(option: str, step_s: float) -> float:
        return step_s / traced_steps[option] if option in traced_steps else 1.0
    llama = [o for o in traced_steps if o.startswith('llama.cpp-')]
    orin_step = 1.0 / 165.2  # llama.cpp CUDA, SmolLM2-135M, Orin Nano Super 25 W
    orin = {'float32': (0.05, 12e-3 / f32),
            **{o: (0.05, decode_to(o, orin_step)) for o in llama}}
    profiles = [Machine(TRACED, f"the traced machine ({replay.report['machine']}; measured "
                        'through the node)', {})]
    for name, (folders, source) in (MEASURED if measured is None else measured).items():
        folders = (folders,) if isinstance(folders, str) else tuple(folders)
        there = [Replay(json.loads((REPO / f / 'bench.json').read_text()))
                 for f in folders]
        where = ', '.join(f'`{f}`' for f in folders)
        profiles.append(measured_machine(name, there, replay, f'{source}, {where}'))
    return profiles + [
        Machine('jetson-orin-nano', 'published: llama.cpp CUDA SmolLM2-135M 165.2 tok/s '
                '(smolhub.com, Orin Nano Super 8GB, 25 W, 2026-06); assumed: torch eager '
                'float32 12 ms per step (kernel-launch bound), every prefill 20x faster '
                'than on the traced CPU, no int8 CPU kernels', orin,
                unavailable=('int8-weight', 'int8-dynamic')),
    ]


def trace_time(trace: dict, machine: Machine) -> float:
    """Return an option's trace seconds on ``machine`` (prefill and decode scaled).

    The admission (validation, tokenizing, a length prediction) is the trace's queue
    time: the goals ran one at a time, so nothing else waited.
    """
    prefill, decode = machine.factor(trace['strategy'])
    return trace['queue_s'] * machine.factor('float32')[0] + trace['prefill_s'] * prefill \
        + trace['decode_s'] * decode


def cached_then(trace: dict) -> int:
    """Return the prompt tokens a traced run took from a cache (its plan note says)."""
    found = CACHED.search(trace.get('note', ''))
    return int(found.group(1)) if found else 0


def cached_now(option: str, n: int, order: str) -> int:
    """Return the prompt tokens a tier run of an ``n``-token prompt finds cached.

    Every tier run repeats a prompt its node prefilled in the loose run: the torch
    prefix cache keeps all its whole blocks but the last token's; a llama.cpp option
    holds the prompts longer than a chunk (several, least recently used out first past
    prefix_cache_mb: every item's of a 20-item run) and takes the whole chunks of all but
    the last token (core.timing.held_prefix). Short robot commands are held by none.
    ``order`` no longer matters (it did while an option held its last prompt only: runs
    before 2026-12-05 14:00 UTC in 'item' order found the prompt AUTO had run held, a
    context-reduced one at times).
    """
    del order
    if option.startswith('llama.cpp-'):
        return held_prefix(n, NodeConfig().llama_chunk)
    return reusable_prefix(n)


def warm_prefill(trace: dict, prefill, cached: int) -> float:
    """Return a trace's prefill seconds had ``cached`` prompt tokens been in a cache.

    The traced seconds scaled by the profile's ``prefill`` (seconds of n tokens) of
    the tokens left to prefill, P(n) - P(cached), against the traced run's own.
    """
    n = trace['prompt_tokens']
    then = prefill(n) - prefill(cached_then(trace))
    if then <= 0.0:
        return trace['prefill_s']
    return trace['prefill_s'] * max(0.0, prefill(n) - prefill(max(cached, cached_then(trace)))) \
        / then


def met_share(seconds: float, budget: float, jitter: list) -> float:
    """Return the share of reruns of a ``seconds`` trace that end by ``budget``.

    ``jitter``: rerun / loose-run time ratios measured through the node (sorted).
    """
    if not jitter:
        return float(seconds <= budget)
    return bisect.bisect_right(jitter, budget / seconds) / len(jitter)


class RecordedLength:
    """The node's length predictor as recorded: its prediction per item, its distribution."""

    def __init__(self, name: str, distribution, predicted: dict, typical: float):
        """Answer ``predicted[item]`` for the item planned (``item``), ``typical`` if skipped."""
        self.name, self.distribution, self.predicted = name, distribution, predicted
        self.typical, self.item, self.skip = typical, '', False

    def predict(self, request, prompt_tokens: int) -> int:
        """Return the recorded prediction of the current item (the running mean if skipped)."""
        return max(1, round(self.typical)) if self.skip else self.predicted[self.item]


def profile_models(report: dict) -> dict:
    """Return {option: TimingModel} of the profiles the node planned with."""
    from timebill_ros.core.timing import TimingModel
    models = {}
    for stem, profile in report['profiles'].items():
        c = profile['coefficients']
        models[stem.split('-cpu-', 1)[1]] = TimingModel(c['a'], c['b'], c['c'], c['p'], c['q'])
    return models


def make_planner(report: dict, machine: Machine, length: RecordedLength, drift: dict,
                 policy: dict, errors: dict | None = None, handover: bool = False,
                 effects: str | None = None):
    """Return the node's planner on the profiles of the traced options, scaled.

    ``drift``: option -> (prefill, decode) ratios of its traces to its profile (what the
    node's online ETE learned); ``policy``: planner settings to replay; ``errors``:
    option -> its time-error ratios at EstimateErrors.QUANTILES (what the node's ETEs
    measured of their own errors); ``handover``: the run traced a hand-over between
    llama.cpp options (runs before it did not: the planner then offers none);
    ``effects``: a cut-effects table to plan with (default: the shipped one).
    """
    from timebill_ros.core.cuts import CutEffects, SHIPPED
    from timebill_ros.core.planning import TimeBillPlanner
    from timebill_ros.core.planner_settings import PlannerSettings
    from timebill_ros.core.timing import TimingModel
    models = {}
    for name, m in profile_models(report).items():
        if name in machine.unavailable or name not in drift:
            continue
        pre, dec = machine.factor(name)
        pre, dec = pre * drift[name][0], dec * drift[name][1]
        models[name] = TimingModel(m.a * pre, m.b * pre, m.c * pre, m.p * dec, m.q * dec)
    main = models.pop('float32')
    settings = replace(PlannerSettings.from_config(NodeConfig()),
                       **{'llama_handover': handover, **policy})
    # auto_precision int8: both copies, int8-weight leading where it is (the pick's order).
    precisions = {p: (lambda m=models[p]: m) for p in ('int8-weight', 'int8-dynamic')
                  if p in models}
    engines = {o: (lambda m=m: m) for o, m in models.items() if o.startswith('llama.cpp-')}
    errors = errors or {}
    return TimeBillPlanner(lambda: main, length, settings, precisions=precisions,
                           effects=CutEffects.load(Path(effects or SHIPPED)), engines=engines,
                           time_errors=lambda option: errors.get(option or 'float32', ()))


class Replay:
    """Replay the strategies of one bench_engines run on machine profiles."""

    def __init__(self, report: dict):
        """Index the run's loose traces by (item, strategy); float32's text is the reference."""
        from timebill_ros.evaluation import robot_workload
        self.report = report
        self.order = report.get('order') or \
            ('item' if '--order item' in report['command'] else 'tier')
        self.models = profile_models(report)
        self.raw = {(t['item'], t['strategy']): t for t in report['traces']
                    if t['outcome'] != 'REFUSED'}
        for (item, strategy), t in list(self.raw.items()):  # 'x + Kill' is option x's
            self.raw.setdefault((item, strategy.split(' + ')[0]), t)
        # Tier runs find their prompt cached: their prefill is the warm one.
        self.traces = {key: {**t, 'prefill_s': warm_prefill(
            t, self._model_of(key[1]).prefill,
            cached_now(key[1], t['prompt_tokens'], self.order))}
            for key, t in self.raw.items()}
        self.items = {i.id: i for i in robot_workload.load() if any(
            t['item'] == i.id for t in report['traces'])}
        self.reference = {t['item']: t['text'] for t in report['traces']
                          if t['strategy'] == 'float32'}
        self.full_s = {t['item']: t['e2e_s'] for t in report['traces']
                       if t['strategy'] == 'float32'}
        steps = {}
        for (_, strategy), t in self.traces.items():
            if t['tokens'] > 1:
                steps.setdefault(strategy, []).append(t['decode_s'] / (t['tokens'] - 1))
        self.steps = {name: statistics.median(values) for name, values in steps.items()}
        self.jitter = sorted(self._reruns(report))
        self.drift = self._drift(report)
        self.errors = self._errors(report)
        self.text: dict = {}  # set by predict_text
        self.typical = statistics.fmean(t['tokens'] for t in report['traces']
                                        if t['strategy'] == 'float32')
        # What a node planning without its predictor reads: the spread of the answers it
        # ran (here the loose full-model answers, all of which finished).
        self.spread = observed_distribution(
            [t['tokens'] for t in report['traces'] if t['strategy'] == 'float32'], [],
            report['max_new_tokens'])

    def request(self, item_id: str):
        """Return the AUTO request of an item as the node receives it."""
        from timebill_ros.core.request import Mode, OverrunPolicy, Request
        item = self.items[item_id]
        return Request(item.instruction, item.context, 10.0, OverrunPolicy.KILL, Mode.AUTO,
                       self.report['max_new_tokens'], NodeConfig().pessimistic_factor)

    def predict_target(self, head_path: str) -> dict:
        """Return {item: length} a target-layer head predicts (the embedded model's states).

        What the node's ``length_predictor`` would have said had it shipped that head, at
        admission (input bounded as the node's). With the shipped head, 1-2 items of 10
        per run differ from the traces' recorded predictions, so compare heads predicted
        here with each other, not with the recording.
        """
        from timebill_ros.runtime.model import load_model
        from timebill_ros.runtime.predictor import load_predictor
        head = load_predictor(head_path, load_model('embedded'),
                              NodeConfig().length_predictor_max_tokens)
        return {item: head.predict(self.request(item), 0) for item in self.items}

    def predict_text(self, choice: str = 'text') -> None:
        """Set ``text``: item -> (prediction, seconds, distribution) of the text length head.

        What the node's ``text_length_predictor`` (``choice``) says of each item (and what
        it took here); the distribution is None past its labels' cap, as the node plans it.
        """
        from timebill_ros.runtime.predictor import text_predictor
        head = text_predictor(choice)
        for index, item_id in enumerate(self.items):
            request = self.request(item_id)
            if index == 0:  # as the node's warm-up at start: no goal pays the first call
                head.calibrated(request, 0)
            start = time.perf_counter()
            predicted, dist = head.calibrated(request, 0)
            self.text[item_id] = (predicted, time.perf_counter() - start, dist)

    def _model_of(self, strategy: str):
        """Return the profile a strategy prefills with (torch options: float32's).

        A hand-over ('llama.cpp-f16>llama.cpp-q4_1') prefills on its first option.
        """
        option = strategy.split(' + ')[0].split('>')[0]
        return self.models[option if option.startswith('llama.cpp-') else 'float32']

    def _drift(self, report: dict) -> dict:
        """Return {option: (prefill, decode) median ratio of its traces to its profile}.

        A traced prefill counts only the prompt tokens its run did not find cached.
        """
        models, drift = self.models, {}
        for name, model in models.items():
            strategy = next((s for (_, s) in self.raw if s.split(' + ')[0] == name), None)
            if strategy is None and name != 'float32':
                continue
            runs = [t for (_, s), t in self.raw.items()
                    if s == (strategy or 'float32') and t['tokens'] > 1]
            pre = [t['prefill_s'] / (model.prefill(t['prompt_tokens'])
                                     - model.prefill(cached_then(t))) for t in runs
                   if model.prefill(t['prompt_tokens']) > model.prefill(cached_then(t))]
            dec = [t['decode_s'] / model.decode(t['prompt_tokens'], t['tokens']) for t in runs]
            drift[name] = (statistics.median(pre), statistics.median(dec))
        return drift

    def _errors(self, report: dict) -> dict:
        """Return {option: time-error ratios at EstimateErrors.QUANTILES}.

        What the node's ETE of an option measures of itself: a goal's decode time over
        the drift-scaled model's estimate, its traces' spread around the drift times a
        rerun's spread around its loose run.
        """
        import numpy as np
        from timebill_ros.core.timing import EstimateErrors
        errors = {}
        for name, model in self.models.items():
            runs = [t for (_, s), t in self.raw.items()
                    if s.split(' + ')[0] == name and t['tokens'] > 1]
            if name not in self.drift or not runs:
                continue
            own = [t['decode_s'] / model.decode(t['prompt_tokens'], t['tokens'])
                   / self.drift[name][1] for t in runs]
            ratios = np.outer(own, self.jitter or [1.0]).ravel()
            errors[name] = tuple(float(x) for x in np.quantile(ratios, EstimateErrors.QUANTILES))
        return errors

    def _reruns(self, report: dict) -> list:
        """Return time ratios of fixed choices' tier runs to their loose runs (same answer).

        A loose run counts with its warm prefill, as the replay times it.
        """
        ratios = []
        for record in report['records']:
            key = (record['item'], record['strategy'])
            loose = self.raw.get(key)
            if record['strategy'] != 'AUTO' and record['outcome'] == 'COMPLETED' and \
                    loose is not None and loose['tokens'] == record['tokens']:
                warm = loose['e2e_s'] - loose['prefill_s'] + self.traces[key]['prefill_s']
                ratios.append(record['e2e_s'] / warm)
        return ratios

    def budget(self, tier: str, item: str, machine: Machine) -> float:
        """Return an item's budget at a tier on ``machine``.

        A tier relative to float32's time ('0.3x') is relative to float32's time there:
        the traced run's, scaled as its trace scales.
        """
        if not tier.endswith('x'):
            return float(tier[:-1])
        trace = {**self.traces[(item, 'float32')], 'strategy': 'float32'}
        there = trace_time(trace, machine) / trace_time(trace, Machine(TRACED, '', {}))
        return float(tier[:-1]) * self.full_s[item] * there

    def fixed(self, strategy: str, item: str, budget: float, machine: Machine) -> tuple:
        """Return (expected met share, F1 of a met answer) of a fixed choice."""
        if strategy.split(' + ')[0] in machine.unavailable:
            return 0.0, 0.0
        trace = {**self.traces[(item, strategy)], 'strategy': strategy.split(' + ')[0]}
        return met_share(trace_time(trace, machine), budget, self.jitter), self._f1(trace, item)

    def auto(self, planner, length, item: str, budget: float, machine: Machine,
             policy: dict) -> tuple:
        """Return (met share, F1, option or 'refused', P(fit)) of AUTO: the node's planner picks.

        ``policy['predictor_share']``: the length predictor runs only when its cost (the
        AUTO trace's admission) is at most that share of the budget; otherwise the goal
        is planned on the spread of answer lengths, with a fixed choice's admission.
        """
        from timebill_ros.core.request import Mode, OverrunPolicy, Rejection, Request
        from timebill_ros.core.timing import with_cached_prefix
        loose = self.traces[(item, 'AUTO')]
        scale = machine.factor('float32')[0]
        admission = loose['queue_s'] * scale
        length.item, length.skip = item, admission > policy['predictor_share'] * budget
        predicted, spread = None, None
        if length.skip:
            admission = self.traces[(item, 'float32')]['queue_s'] * scale
            predicted, spread = round(self.spread.quantile(0.5, 0.0)), self.spread
            text = self.text.get(item) if policy.get('text_head', True) else None
            if text is not None and text[1] * scale <= policy['predictor_share'] * budget:
                # The node's text head stands in (serving.admission._by_text).
                admission += text[1] * scale
                predicted, spread = text[0], text[2]
        source = self.items[item]
        request = Request(source.instruction, source.context, budget, OverrunPolicy.KILL,
                          Mode.AUTO, self.report['max_new_tokens'],
                          NodeConfig().pessimistic_factor)
        n = loose['prompt_tokens']
        held = {option: cached_now(option, n, self.order) for option in planner.context.engines}
        try:
            plan = planner.plan(request, n, budget - admission, predicted,
                                timing=with_cached_prefix(planner.timing(),
                                                          cached_now('', n, self.order)),
                                spread=spread,
                                engine_prefix={o: k for o, k in held.items() if k})
        except Rejection as exc:
            # The node's idle_best_effort: goals arrive one at a time here, so the node
            # is idle and a Kill goal with a token that fits runs on its best option.
            if not policy.get('idle_best_effort', True) or exc.plan is None \
                    or exc.plan.fits_tokens < 1:
                return 0.0, 0.0, 'refused', 0.0
            plan = exc.plan
        option = self._option(plan)
        trace = {**self.traces[(item, option)], 'strategy': option, 'queue_s': 0.0}
        took = admission + trace_time(trace, machine)
        if plan.fallback is not None and took > budget:  # the switch takes over in time
            low = {**self.traces[(item, plan.fallback.precision)],
                   'strategy': plan.fallback.precision, 'queue_s': 0.0}
            took, trace = admission + trace_time(low, machine), low
        return met_share(took, budget, self.jitter), self._f1(trace, item), option, \
            plan.fit_probability

    def _option(self, plan) -> str:
        handover = handover_of(plan.precision, plan.prefill_precision)
        if handover:  # its own trace
            return handover
        if plan.precision.startswith('llama.cpp-'):
            return plan.precision
        if plan.eviction_ratio > 0.0:
            return 'alpha 0.5'  # the traced ratio stands for any (short prompts skip it)
        return TRACE_OF.get(plan.precision, 'float32')

    def _f1(self, trace: dict, item: str) -> float:
        return metrics.token_f1(trace['text'], self.reference[item])


def evaluate(report: dict, policy: dict | None = None,
             measured: dict | None = None) -> dict:
    """Return {machine: {tier: {strategy: expected met, F1}}} and the gap to the node's counts.

    ``policy``: AUTO's settings to replay (``fit_tolerance``, ``predictor_share``, ...;
    the node's defaults for the rest). ``text_head_s``: what the text length head is
    taken to cost a goal (default: as timed here, which varies with this machine's load);
    ``effects``: the path of a cut-effects table AUTO plans with (default: the shipped one);
    ``per_goal``: each row also lists its goals (item, met share; AUTO's option, P(fit)).
    """
    from timebill_ros.runtime.length_heads import LinearHead
    from timebill_ros.runtime.predictor import SHIPPED_HEAD
    config = NodeConfig()
    policy = {'fit_tolerance': config.fit_tolerance, **(policy or {})}
    share = policy.pop('predictor_share', config.predictor_share)
    best_effort = policy.pop('idle_best_effort', config.idle_best_effort)
    text_head = policy.pop('text_head', config.text_length_predictor != 'none')
    text_head_s = policy.pop('text_head_s', None)
    effects = policy.pop('effects', None)
    length_head = policy.pop('length_head', None)
    text_head_path = policy.pop('text_head_path', 'text')
    per_goal = policy.pop('per_goal', False)
    replay = Replay(report)
    if text_head:
        replay.predict_text(text_head_path)
        if text_head_s is not None:
            replay.text = {item: (length, text_head_s, spread)
                           for item, (length, _, spread) in replay.text.items()}
    if length_head == 'oracle':
        # An upper bound: every prediction is the length float32's loose answer ran to,
        # from either head; the distributions and the costs stay the heads'.
        lengths = {item: trace['tokens'] for (item, strategy), trace in replay.traces.items()
                   if strategy == 'float32'}
        replay.text = {item: (lengths[item], took, spread)
                       for item, (_, took, spread) in replay.text.items()}
        length = RecordedLength('oracle (float32 answer lengths)',
                                LinearHead.load(SHIPPED_HEAD).distribution, lengths,
                                replay.typical)
    elif length_head:
        length = RecordedLength(f'rlp ({length_head})', LinearHead.load(length_head).distribution,
                                replay.predict_target(length_head), replay.typical)
    else:
        predicted = {t['item']: t['predicted'] for t in report['traces']
                     if t['strategy'] == 'AUTO'}
        length = RecordedLength('rlp (recorded)', LinearHead.load(SHIPPED_HEAD).distribution,
                                predicted, replay.typical)
    out = {}
    for machine in machines(replay, measured):
        planner = make_planner(report, machine, length, replay.drift, policy, replay.errors,
                               handover=any('>' in strategy for _, strategy in replay.raw),
                               effects=effects)
        tiers = {}
        for tier in report['tiers']:
            rows = {}
            for strategy in report['strategies']:
                results = []
                for item in replay.full_s:
                    budget = replay.budget(tier, item, machine)
                    if strategy == 'AUTO':
                        results.append(replay.auto(
                            planner, length, item, budget, machine,
                            {'predictor_share': share, 'idle_best_effort': best_effort,
                             'text_head': text_head}))
                    else:
                        results.append(replay.fixed(strategy, item, budget, machine))
                rows[strategy] = _row(results)
                if per_goal:
                    rows[strategy]['per_goal'] = [_goal(item, result) for item, result
                                                  in zip(replay.full_s, results)]
            tiers[tier] = rows
        out[machine.name] = {'source': machine.source, 'tiers': tiers}
    traced = out[TRACED]['tiers']
    return {'machines': out, 'gap_points': gap_points(report, traced),
            'within_2_sd': within_spread(report, traced),
            'policy': {**policy, 'predictor_share': share, 'idle_best_effort': best_effort,
                       'text_head': text_head, 'text_head_s': text_head_s,
                       'length_predictor': length.name,
                       **({'effects': effects} if effects else {})}}


def _row(results: list) -> dict:
    """Return expected met count, goals and the met-weighted F1 of (share, F1, ...) results.

    ``sd``: the met count's standard deviation over reruns, each goal met or not with its
    share (independently): how far one run through the node may land from ``met``.
    """
    met = sum(r[0] for r in results)
    row = {'met': met, 'goals': len(results),
           'sd': math.sqrt(sum(r[0] * (1.0 - r[0]) for r in results)),
           'f1_met': sum(r[0] * r[1] for r in results) / met if met else 0.0}
    if len(results[0]) > 2:
        row['choices'] = _count(r[2] for r in results)
    return row


def _goal(item: str, result: tuple) -> dict:
    """Return one goal of a row: its item, met share and (AUTO) option and P(fit)."""
    goal = {'item': item, 'met': result[0]}
    if len(result) > 2:
        goal.update(option=result[2] or 'float32', fit=result[3])
    return goal


def _count(names) -> dict:
    counts: dict = {}
    for name in names:
        counts[name or 'float32'] = counts.get(name or 'float32', 0) + 1
    return counts


def restricted(report: dict, items: set) -> dict:
    """Return a run's report with only the goals of ``items`` (traces, records, count)."""
    return {**report, 'items': len(items),
            'traces': [t for t in report['traces'] if t['item'] in items],
            'records': [r for r in report['records'] if r['item'] in items]}


def cross_check(report: dict, target: dict, profile: str, policy: dict) -> dict:
    """Return a run's replay on ``profile`` against ``target``, run on that machine.

    ``report``'s traces, restricted to the items ``target`` ran, are replayed on the
    profile; ``target``'s met counts through the node there are what it should predict.
    The profile must not come from ``target`` itself (it would be fitted on what it
    predicts).
    """
    items = {t['item'] for t in target['traces']}
    missing = items - {t['item'] for t in report['traces']}
    if missing:
        raise SystemExit(f'--against: the runs lack {len(missing)} of its items')
    evaluation = evaluate(restricted(report, items), policy)
    tiers = evaluation['machines'][profile]['tiers']
    return {'profile': profile, 'tiers': tiers, 'gap_points': gap_points(target, tiers),
            'within_2_sd': within_spread(target, tiers)}


def planner_overrides(pairs: list) -> dict:
    """Return {name: value} of NAME=VALUE pairs, each checked by the node's parameter table."""
    from timebill_ros.core.planner_settings import PlannerSettings
    known = set(PlannerSettings.__dataclass_fields__)
    overrides = {}
    for name, value in common.param_pairs(pairs).items():
        if name not in known:
            raise SystemExit(f'--set {name}: not a planner setting '
                             f'({", ".join(sorted(known))})')
        try:
            overrides[name] = getattr(NodeConfig.from_dict({name: value}), name)
        except ValueError as exc:
            raise SystemExit(f'--set {name}={value}: {exc}') from exc
    return overrides


def main(argv=None) -> int:
    """Evaluate bench_engines runs; write evaluation.json and EVALUATION.md to a new folder."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('runs', nargs='+', help='bench_engines results folders (bench.json)')
    parser.add_argument('--out', help=f'{harness.OUT_HELP}; one sub-folder per run')
    parser.add_argument('--no-idle-best-effort', action='store_true',
                        help='replay AUTO with idle_best_effort false (refuse what does '
                             'not fit even on an idle node)')
    parser.add_argument('--no-text-head', action='store_true',
                        help='replay a skipped length predictor as planned on the spread of '
                             'recent answers, as nodes before the text head did (runs '
                             'before 4dbf693)')
    parser.add_argument('--set', action='append', default=[], metavar='NAME=VALUE',
                        help="replay AUTO with a planner parameter changed (e.g. "
                             "'fit_tolerance=0'; repeatable)")
    parser.add_argument('--effects', metavar='TABLE',
                        help='replay AUTO planning with this cut-effects table (a '
                             'measure_cuts --out; default: the shipped one)')
    parser.add_argument('--length-head', metavar='HEAD',
                        help="replay AUTO as if the node's length_predictor were this head "
                             "(predicted again on each item; 'oracle': both heads say the "
                             "length of float32's answer, an upper bound; default: the "
                             'recorded predictions of the shipped head)')
    parser.add_argument('--text-head', metavar='HEAD',
                        help='replay AUTO with this text_length_predictor head (default: '
                             'the shipped one)')
    parser.add_argument('--against', metavar='RUN',
                        help="a bench_engines run on another machine: replay the runs' "
                             'traces of its items on --profile and compare with its counts')
    parser.add_argument('--profile', default='intel-xeon-2c',
                        help='the machine profile --against ran on (default intel-xeon-2c)')
    args = parser.parse_args(argv)
    out = harness.claim_out(args.out, 'evaluate_planning')
    policy = {'idle_best_effort': False} if args.no_idle_best_effort else {}
    policy.update(planner_overrides(args.set))
    if args.no_text_head:
        policy['text_head'] = False
    if args.effects:
        policy['effects'] = args.effects
    if args.length_head:
        policy['length_head'] = args.length_head
    if args.text_head:
        policy['text_head_path'] = args.text_head
    command = 'python -m benchmarks.evaluate_planning ' + ' '.join(argv or sys.argv[1:])
    reports = [json.loads((Path(run) / 'bench.json').read_text()) for run in args.runs]
    if args.against:
        target = json.loads((Path(args.against) / 'bench.json').read_text())
        checks = [(Path(run).name, cross_check(report, target, args.profile, dict(policy)))
                  for run, report in zip(args.runs, reports)]
        (out / 'cross_check.json').write_text(json.dumps(dict(checks), indent=1) + '\n')
        text = cross_markdown(target, checks, command)
        (out / 'CROSS_CHECK.md').write_text(text + '\n', encoding='utf-8')
        print(text)
        return 0
    spread = repeatability(reports)
    if spread is not None:
        text = (f"The node's own repeatability over runs {', '.join(spread['runs'])} (same "
                f"items): fixed choices' met rate differs by up to {spread['max_points']:.0f} "
                f"points between runs (mean {spread['mean_points']:.1f}) per tier cell.")
        (out / 'REPEATABILITY.md').write_text(text + '\n', encoding='utf-8')
        (out / 'repeatability.json').write_text(json.dumps(spread, indent=1) + '\n')
        print(text)
    evaluations = []
    for run, report in zip(args.runs, reports):
        folder = Path(run)
        evaluation = evaluate(report, dict(policy))
        evaluations.append(evaluation)
        target = out / folder.name
        target.mkdir(parents=True, exist_ok=True)
        (target / 'evaluation.json').write_text(json.dumps(evaluation, indent=1) + '\n')
        text = (f'Command: `{command}` (commit {common.commit()}, '
                f'{time.strftime("%Y-%m-%d")}, {common.machine()}); '
                f'policy: {evaluation["policy"]}.\n\n'
                + markdown(report, evaluation))
        (target / 'EVALUATION.md').write_text(text + '\n', encoding='utf-8')
        print(text)
    if len(reports) > 1:
        cells = pooled(list(zip(reports, evaluations)), TRACED)
        (out / 'pooled.json').write_text(json.dumps(cells, indent=1) + '\n')
        pairs = paired(reports)
        (out / 'paired.json').write_text(json.dumps(pairs, indent=1) + '\n')
        sums = pooled_profiles(evaluations)
        (out / 'pooled_profiles.json').write_text(json.dumps(sums, indent=1) + '\n')
        text = pooled_markdown(reports, cells, command) + '\n\n' + paired_markdown(pairs) \
            + '\n\n' + profiles_markdown(reports[0]['strategies'], sums)
        (out / 'POOLED.md').write_text(text + '\n', encoding='utf-8')
        print(text)
    return 0


if __name__ == '__main__':
    sys.exit(main())
