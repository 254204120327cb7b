# SPDX-License-Identifier: Apache-2.0
"""Measure what each quality cut does to the target model's answers on the train split.

``python -m training.measure_cuts`` answers every train item of the robot
workload greedily with the full model, with the decode steps at each low precision
(``--precisions``: int8-dynamic, int8-weight), and under KV eviction at a few ratios (on
prompts long enough for eviction to matter), and writes per cut the answer-length factor
(sum of cut lengths / sum of full lengths) and the fidelity (mean ROUGE-L of the cut's
answer against the full model's) to the shipped table the planner reads
(timebill_ros/data/cut_effects.json), plus a report (results/cut_effects.{md,json}). The
test split is never read. ``--merge`` keeps the entries of the existing table this run
does not measure (e.g. ``--alphas`` with no ratio and ``--precisions int8-weight`` adds
one precision's row).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
import platform
import sys
import time

import numpy as np

from benchmarks import harness
from benchmarks.paths import DATA
from timebill_ros.serving.loop import generate

SHIPPED = DATA / 'cut_effects.json'  # = core.cuts.SHIPPED
PRECISIONS = ('int8-dynamic', 'int8-weight')
SIXTEEN_BIT = ('bfloat16',)  # = core.cut_kinds.SIXTEEN_BIT on a CPU (float16 needs CUDA)
LLAMA_FORMATS = ('f16', 'q8_0', 'q4_k_m', 'q4_1')  # = core.config.LLAMA_FORMATS


def answer(engine, ids, plan, max_new_tokens: int) -> tuple:
    """Return (text, tokens) of one greedy answer under ``plan``."""
    parts = []

    def keep(event) -> bool:
        parts.append(event.text_delta)
        return True
    stats = generate(engine, ids, max_new_tokens, plan, keep)
    return ''.join(parts), stats.tokens


class _Log:
    def info(self, message):
        print(message, flush=True)

    warning = error = info


def _arguments(argv) -> argparse.Namespace:
    """Parse the command line; name the table and report (a new run folder by default)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--model', default='embedded')
    parser.add_argument('--press', default='snapkv')
    parser.add_argument('--alphas', type=float, nargs='*', default=[0.3, 0.6, 0.9])
    parser.add_argument('--precisions', nargs='*', default=list(PRECISIONS),
                        choices=PRECISIONS + SIXTEEN_BIT,
                        help='low precisions to decode at; a 16-bit one is also measured '
                        'prefilling the prompt (row <precision>-prefill)')
    parser.add_argument('--engines', nargs='*', default=[], choices=LLAMA_FORMATS,
                        help='llama.cpp GGUF formats to measure as engine options (their '
                        'rows are named llama.cpp-<format>), and each prefilling for each '
                        'listed after it (rows llama.cpp-<a>>llama.cpp-<b>)')
    parser.add_argument('--merge', action='store_true',
                        help='keep the entries of --out that this run does not measure')
    parser.add_argument('--max-new-tokens', type=int, default=128)
    parser.add_argument('--min-evict-prompt', type=int, default=256,
                        help='measure eviction only on prompts this long: on shorter ones it '
                        'saves under min_cut_saving and the planner never uses it')
    parser.add_argument('--limit', type=int, default=0, help='first N train items (0: all)')
    parser.add_argument('--every', type=int, default=1,
                        help='use every N-th train item (a spread over all kinds)')
    parser.add_argument('--rows', default=None, metavar='REPORT_JSON',
                        help="build the table from an earlier run's measured answers (its "
                        'report .json) instead of answering again; the cut options are ignored')
    parser.add_argument('--out', default=None, help='effects JSON (default: see --ship)')
    parser.add_argument('--report', default=None, help='report stem (default: in the run folder)')
    parser.add_argument('--ship', action='store_true',
                        help='write the shipped timebill_ros/data/cut_effects.json (default: '
                        'a new results folder)')
    args = parser.parse_args(argv)
    run = None if args.out and args.report else harness.run_dir('cut_effects')
    args.out = args.out or str(SHIPPED if args.ship else run / 'cut_effects.json')
    args.report = args.report or str(run / 'cut_effects')
    return args


def _cuts(args, options) -> dict:
    """Return {name: Plan} of the cuts to answer under."""
    from timebill_ros.core.cut_kinds import handover_name
    from timebill_ros.core.planning import Plan
    from timebill_ros.core.request import Mode
    cuts = {low: Plan(precision=low) for low in (*args.precisions, *options)}
    # Each engine prefilling for each listed after it, the KV handed over (EngineHandOver).
    handovers = {handover_name(a, b): Plan(precision=b, prefill_precision=a)
                 for i, a in enumerate(options) for b in list(options)[i + 1:]}
    cuts.update(handovers)
    cuts.update({f'{low}-prefill': Plan(precision=low, prefill_precision=low)
                 for low in args.precisions if low in SIXTEEN_BIT})
    for alpha in args.alphas:
        cuts[f'evict {alpha:g}'] = Plan(mode=Mode.EVICTION, eviction_ratio=alpha,
                                        press=args.press)
    return cuts


def _measure(args, loaded) -> list:
    """Answer every train item with the full model and under each cut; return the rows."""
    from timebill_ros.core.eviction import press_skip_reason
    from timebill_ros.core.planning import Plan
    from timebill_ros.evaluation import robot_workload
    from timebill_ros.evaluation.metrics import rouge_l
    from timebill_ros.runtime.engine import Engine
    from timebill_ros.runtime.model import precision_variant, prompt_ids
    from timebill_ros.runtime.presses import press_for_plan
    engine = Engine(loaded, press_for_plan, decode_threads=1, variants={
        low: precision_variant(loaded, low) for low in args.precisions})
    options = {}
    if args.engines:
        from timebill_ros.core.config import NodeConfig
        from timebill_ros.serving.engine_options import llama_engines
        from timebill_ros.serving.resident import ResidentEngines
        config = NodeConfig.from_dict({'llama_engines': ','.join(args.engines),
                                       'max_batch': 1})
        options = llama_engines(config, loaded, _Log())
        if len(options) != len(args.engines):
            raise SystemExit('llama.cpp engine options unavailable (see the warning above)')
        engine = ResidentEngines(engine, options)
    items = robot_workload.load('train')[::max(1, args.every)]
    if args.limit:
        items = items[:args.limit]
    cuts = _cuts(args, options)
    rows = []
    for number, item in enumerate(items, 1):
        ids = prompt_ids(loaded.tokenizer, item.instruction, item.context)
        text, tokens = answer(engine, ids, Plan(), args.max_new_tokens)
        row = {'id': item.id, 'kind': item.kind, 'prompt_tokens': len(ids),
               'full': {'tokens': tokens, 'score': robot_workload.score(item, text)}}
        for name, plan in cuts.items():
            if plan.eviction_ratio and (len(ids) < args.min_evict_prompt or press_skip_reason(
                    args.press, len(ids), plan.eviction_ratio)):
                continue
            cut_text, cut_tokens = answer(engine, ids, plan, args.max_new_tokens)
            row[name] = {'tokens': cut_tokens, 'fidelity': rouge_l(cut_text, text) if text
                         else float(not cut_text),
                         'score': robot_workload.score(item, cut_text)}
        rows.append(row)
        print(f'[{number}/{len(items)}] {item.id} full {tokens} tokens; ' + ', '.join(
            f"{k} {v['tokens']}" for k, v in row.items() if isinstance(v, dict)
            and k != 'full'), flush=True)
    return rows


def _summary(rows: list) -> dict:
    """Return {cut: items, length factor and ratios, fidelity, task scores} over ``rows``."""
    from timebill_ros.core.cuts import length_factor, length_ratios
    names = list(dict.fromkeys(k for row in rows for k, v in row.items()
                               if isinstance(v, dict) and k != 'full'))
    summary = {}
    for name in names:
        ran = [r for r in rows if name in r]
        scored = [r for r in ran if r['full']['score'] is not None]
        full, cut = [r['full']['tokens'] for r in ran], [r[name]['tokens'] for r in ran]
        summary[name] = {
            'items': len(ran),
            'length_factor': length_factor(full, cut),
            'length_ratios': list(length_ratios(full, cut)),
            'ratio_10_50_90': list(length_ratios(full, cut, (0.1, 0.5, 0.9))),
            'quality': float(np.mean([r[name]['fidelity'] for r in ran])),
            'task_score_cut': float(np.mean([r[name]['score'] for r in scored]))
            if scored else None,
            'task_score_full': float(np.mean([r['full']['score'] for r in scored]))
            if scored else None}
    return summary


def _table(args, summary: dict, source: str):
    """Return the CutEffects of ``summary`` (merged into --out's with --merge)."""
    from timebill_ros.core.cuts import CutEffect, CutEffects

    def effect(s: dict) -> CutEffect:
        return CutEffect(s['length_factor'], min(1.0, s['quality']),
                         tuple(s.get('length_ratios', ())))
    evictions = sorted((float(name.split()[1]), s) for name, s in summary.items()
                       if name.startswith('evict '))
    precision = {name: effect(s) for name, s in summary.items()
                 if not name.startswith('evict ')}
    ratios = tuple(a for a, _ in evictions)
    eviction = tuple(effect(s) for _, s in evictions)
    if args.merge and Path(args.out).exists():
        old = CutEffects.load(Path(args.out))
        precision = {**old.precision, **precision}
        if not evictions:
            ratios, eviction = old.eviction_ratios, old.eviction
        source = f'{old.source}; {", ".join(summary)}: {source}'
    return CutEffects(eviction_ratios=ratios, eviction=eviction, precision=precision,
                      source=source)


def _report(args, summary: dict, rows: list, source: str, minutes: float) -> list:
    """Write the report (.json with every row, .md with the table); return its lines."""
    report = Path(args.report)
    report.parent.mkdir(parents=True, exist_ok=True)
    report.with_suffix('.json').write_text(json.dumps(
        {'summary': summary, 'rows': rows, 'minutes': minutes, 'argv': sys.argv[1:],
         'source': source}, indent=1) + '\n', encoding='utf-8')
    lines = [f'# Effect of each quality cut on the answers ({time.strftime("%Y-%m-%d")})', '',
             f'`python -m training.measure_cuts {" ".join(sys.argv[1:])}` on '
             f'{platform.node()} {platform.machine()}, {minutes:.1f} min; {source}.', '',
             'Length factor: sum of answer tokens under the cut / under the full model (items '
             'where the cut can run); ratio 10 % / 50 % / 90 %: quantiles of one answer\'s '
             'length under the cut over the full model\'s. Fidelity: mean ROUGE-L against the '
             'full model\'s answer. Task score: exact/number/JSON/choice match on items with '
             'a reference.', '',
             '| cut | items | length factor | ratio 10 % / 50 % / 90 % | fidelity | '
             'task score cut | task score full |',
             '|---|---|---|---|---|---|---|']

    def pct(value):
        return '-' if value is None else f'{value:.2f}'
    for name, s in summary.items():
        spread = ' / '.join(f'{r:.2f}' for r in s['ratio_10_50_90'])
        lines.append(f"| {name} | {s['items']} | {s['length_factor']:.2f} | {spread} | "
                     f"{s['quality']:.2f} | {pct(s['task_score_cut'])} | "
                     f"{pct(s['task_score_full'])} |")
    report.with_suffix('.md').write_text('\n'.join(lines) + '\n', encoding='utf-8')
    return lines


def main(argv=None) -> int:
    """Run the measurement (or read an earlier one's rows); write the table and the report."""
    from timebill_ros.runtime.model import load_model
    args = _arguments(argv)
    started = time.monotonic()
    loaded = load_model(args.model)
    if args.rows:
        earlier = json.loads(Path(args.rows).read_text(encoding='utf-8'))
        rows = earlier['rows']
        source = earlier.get('source') or (
            f'measure_cuts on {len(rows)} robot train items, model {loaded.name}, rows of '
            f'{args.rows}')
    else:
        rows = _measure(args, loaded)
        source = (f'measure_cuts on {len(rows)} robot train items, model {loaded.name}, '
                  f'press {args.press}, {time.strftime("%Y-%m-%d")}')
    summary = _summary(rows)
    effects = _table(args, summary, source)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)  # a new run folder
    effects.save(Path(args.out))
    lines = _report(args, summary, rows, source, (time.monotonic() - started) / 60.0)
    print('\n'.join(lines))
    return 0


if __name__ == '__main__':
    sys.exit(main())
