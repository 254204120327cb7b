# SPDX-License-Identifier: Apache-2.0
"""Measure what lowering each layer to int8 costs: KL per unit, additivity, times, memory.

``python -m training.measure_precision`` (``make measure-precision``):

1. KL(float32 || mix) of the next-token distribution (the prompt's last position and
   the next ``--follow`` greedy ones) with each unit (decoder layer, then the LM head)
   alone lowered to ``--low`` (int8-dynamic or int8-weight), on calibration prompts:
   robot-workload train items and long-context prompts (needle and SQuAD, seeds apart
   from the benchmarks'). Written to the shipped table the planner reads
   (timebill_ros/data/precision_kl.json, or precision_kl.<low>.json).
2. Additivity on held-out prompts (robot test items, other long-context seeds): for
   mixes the DP picks at several step budgets and a few random ones, the summed unit
   KL against the KL measured with that mix.
3. Per-unit decode-step times at both precisions (fit a + c L / 1024), the DP's Pareto
   front (step time vs predicted KL), the DP's cost per call, the switch time and the
   memory of the resident copies.

Outputs: the table, results/precision/{README.md,bench.json,pareto.png}.
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path
import random
import statistics
import sys
import time
from benchmarks import harness
from benchmarks.common import machine, stamped_log
from benchmarks.harness import write_outputs
from timebill_ros.core.precision import shipped_unit_kl
from timebill_ros.runtime.model import FLOAT32_ACTIVATIONS


def weight_bytes(model) -> int:
    """Return the bytes of a model's weights, int8 packed Linears included."""
    import torch
    total, seen = 0, set()
    for module in model.modules():
        packed = getattr(module, '_packed_params', None)
        if packed is not None and hasattr(module, 'weight') and callable(module.weight):
            weight = module.weight()
            total += weight.numel() * weight.element_size()
            total += weight.q_per_channel_scales().numel() * 8 \
                if weight.qscheme() == torch.per_channel_affine else 8
            continue
        for tensor in list(module.parameters(recurse=False)) + \
                list(module.buffers(recurse=False)):
            if id(tensor) not in seen:
                seen.add(id(tensor))
                total += tensor.numel() * tensor.element_size()
    return total


def prompts(tokenizer, split: str, robot: int, long_items: int, seed: int) -> list:
    """Return (label, token ids) of robot items of ``split`` and long-context prompts."""
    from timebill_ros.evaluation import robot_workload, tasks
    from timebill_ros.runtime.model import prompt_ids
    items = robot_workload.load(split)
    random.Random(seed).shuffle(items)
    out = [(f'robot:{item.id}', prompt_ids(tokenizer, item.instruction, item.context))
           for item in items[:robot]]
    for task in ('needle', 'squad')[:max(0, long_items)]:
        for item in tasks.select(task, tokenizer, max(1, long_items // 2), 500, 1600, seed):
            out.append((f'{task}:{item.item_id}',
                        prompt_ids(tokenizer, item.instruction, item.context)))
    return out


def markdown(report: dict) -> str:
    """Render the README."""
    t, add = report['times'], report['additivity']
    lines = [f"# Per-layer {report['low']} precision ({report['date']})", '',
             f"`{report['command']}` on {report['machine']}, {report['minutes']:.1f} min; "
             f"{report['calibration_prompts']} calibration prompts, "
             f"{report['heldout_prompts']} held-out prompts.", '',
             '## KL per lowered unit (calibration prompts)', '',
             '| unit | KL | step share fp32 | step share low |', '|---|---|---|---|']
    for name, kl, sf, si in zip(report['unit_names'], report['unit_kl'],
                                t['full_share'], t['low_share']):
        lines.append(f'| {name} | {kl:.4f} | {sf:.3f} | {si:.3f} |')
    lines += ['', f"All units lowered: KL {report['all_low_kl']:.4f} (summed unit KL "
              f"{sum(report['unit_kl']):.4f}).", '',
              '## Additivity on held-out prompts', '',
              '| mix | units lowered | predicted KL | measured KL | error |',
              '|---|---|---|---|---|']
    for row in add['mixes']:
        lines.append(f"| {row['label']} | {row['lowered']} | {row['predicted']:.4f} | "
                     f"{row['measured']:.4f} | {row['error_pct']:+.0f} % |")
    lines += ['', f"DP mixes: mean |error| {add['dp_mean_abs_error_pct']:.1f} %, within 25 % "
              f"for {add['dp_within_25']} of {add['dp_count']}.", '',
              '## Times and memory', '',
              f"- decode step at 512 KV: float32 {t['full_step_ms']:.1f} ms, {report['low']} "
              f"{t['low_step_ms']:.1f} ms (per-unit profile, 1 thread).",
              f"- switching a mix (reference swaps): median {t['switch_ms']:.3f} ms.",
              f"- DP per call (31 units): median {t['dp_ms']:.3f} ms.",
              f"- resident weights: float32 {report['memory_mb']['full']:.0f} MB, low copy "
              f"{report['memory_mb']['low']:.0f} MB, shell 0 MB (references).", '',
              'Pareto front of the DP (step time at 512 KV vs predicted KL): pareto.png.']
    return '\n'.join(lines)


def plot(report: dict, out: Path) -> None:
    """Write pareto.png."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    front = report['pareto']
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    ax.plot([p['step_ms'] for p in front], [p['predicted_kl'] for p in front], marker='.',
            label='DP: least predicted KL per step budget')
    measured = [r for r in report['additivity']['mixes'] if r['label'].startswith('dp')]
    ax.scatter([r['step_ms'] for r in measured], [r['measured'] for r in measured],
               color='C3', zorder=3, label='measured KL (held-out)')
    ax.set_xlabel('decode step at 512 KV (ms)')
    ax.set_ylabel('KL vs float32')
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / 'pareto.png', dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    """Measure and write the table and report."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--model', default='embedded')
    parser.add_argument('--robot', type=int, default=24, help='robot prompts per split')
    parser.add_argument('--long', type=int, default=4, help='long-context prompts per split')
    parser.add_argument('--follow', type=int, default=4)
    parser.add_argument('--threads', type=int, default=1, help='decode threads when timing')
    parser.add_argument('--low', default='int8-dynamic', choices=FLOAT32_ACTIVATIONS,
                        help='the precision a unit is lowered to')
    parser.add_argument('--out', default='', help='KL table (default: see --ship)')
    parser.add_argument('--report', default='',
                        help='report folder (default: results/precision_<low>-<UTC time>)')
    parser.add_argument('--ship', action='store_true',
                        help='write the shipped table for --low (default: a new results folder)')
    args = parser.parse_args(argv)
    low_name = args.low
    run = harness.run_dir(f'precision_{low_name}')
    args.report = args.report or str(run)
    args.out = args.out or str(shipped_unit_kl(low_name) if args.ship
                               else Path(args.report) / 'precision_kl.json')
    import numpy as np
    from timebill_ros.core.precision import Mix, PrecisionTable
    from timebill_ros.runtime.model import load_model, precision_variant
    from timebill_ros.runtime.precision import (
        measure_unit_kl, MixedModel, next_token_kl, reference_logp, time_apply, unit_times)
    started = time.monotonic()

    log = stamped_log(started)
    full = load_model(args.model)
    low = precision_variant(full, low_name)
    mixed = MixedModel(full, low)
    calib = prompts(full.tokenizer, 'train', args.robot, args.long, seed=101)
    held = prompts(full.tokenizer, 'test', args.robot // 2, args.long, seed=202)
    log(f'{len(calib)} calibration prompts, {len(held)} held-out; {mixed.units} units')
    kl = measure_unit_kl(mixed, [ids for _, ids in calib], args.follow,
                         progress=lambda u: log(f'unit {u}') if u % 10 == 9 else None)
    log(f"all-int8 KL {kl['all_low_kl']:.4f}, summed {sum(kl['unit_kl']):.4f}")
    full_times = unit_times(full, threads=args.threads)
    low_times = unit_times(low, threads=args.threads)
    table = PrecisionTable(low_name, full_times, low_times, tuple(kl['unit_kl']),
                           kl['all_low_kl'])
    kv = 512.0
    full_step, low_step = full_times.total(kv), low_times.total(kv)
    pareto, dp_times = [], []
    for budget in np.linspace(low_step, full_step, 41):
        t0 = time.perf_counter()
        mix = table.choose(kv, full_step, low_step, float(budget))
        dp_times.append(time.perf_counter() - t0)
        if mix is not None:
            pareto.append({'budget_ms': float(budget) * 1e3, 'lowered': list(mix.lowered),
                           'step_ms': table.step_scale(mix, kv, full_step, low_step) * 1e3,
                           'predicted_kl': mix.predicted_kl})
    # Additivity: DP mixes at five budgets and four random mixes, on held-out prompts.
    ids_list, refs = reference_logp(mixed.apply(()), [ids for _, ids in held], args.follow)
    chosen = []
    for share in (0.2, 0.4, 0.6, 0.8, 0.95):
        mix = table.choose(kv, full_step, low_step, full_step - share * (full_step - low_step))
        if mix is not None and mix.lowered and mix.lowered not in [c[1] for c in chosen]:
            chosen.append((f'dp {share:.0%} of the saving', mix.lowered))
    rng = random.Random(7)
    for size in sorted({min(n, mixed.units - 1) for n in (3, 8, 15, 24)} - {0}):
        chosen.append((f'random {size}', tuple(sorted(rng.sample(range(mixed.units), size)))))
    rows = []
    for label, lowered in chosen:
        measured = next_token_kl(mixed.apply(lowered), refs, ids_list)
        predicted = table.predicted_kl(lowered)
        rows.append({'label': label, 'lowered': len(lowered), 'units': list(lowered),
                     'predicted': predicted, 'measured': measured,
                     'error_pct': (predicted - measured) / measured * 100.0,
                     'step_ms': table.step_scale(Mix(lowered, mixed.units), kv, full_step,
                                                 low_step) * 1e3})
        log(f'{label}: predicted {predicted:.4f}, measured {measured:.4f}')
    mixed.apply(())
    dp_rows = [r for r in rows if r['label'].startswith('dp')]
    switch = time_apply(mixed, [row['units'] for row in rows] * 10)
    full_share, low_share, _ = table.shares(kv)
    names = [f'layer {u}' for u in range(mixed.units - 1)] + ['lm_head']
    table_out = {'source': full.name, 'low': low_name, 'units': mixed.units, 'unit_names': names,
                 'unit_kl': [float(v) for v in kl['unit_kl']],
                 'all_low_kl': float(kl['all_low_kl']), 'follow': args.follow,
                 'prompts': [label for label, _ in calib],
                 'date': datetime.date.today().isoformat(),
                 'command': 'python -m training.measure_precision '
                            + ' '.join(argv if argv is not None else sys.argv[1:])}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(table_out, indent=1) + '\n', encoding='utf-8')
    report = {**table_out, 'machine': machine(), 'minutes': (time.monotonic() - started) / 60,
              'calibration_prompts': len(calib), 'heldout_prompts': len(held),
              'additivity': {'mixes': rows,
                             'dp_mean_abs_error_pct': statistics.fmean(
                                 abs(r['error_pct']) for r in dp_rows) if dp_rows else 0.0,
                             'dp_within_25': sum(abs(r['error_pct']) <= 25 for r in dp_rows),
                             'dp_count': len(dp_rows)},
              'times': {'full_step_ms': full_step * 1e3, 'low_step_ms': low_step * 1e3,
                        'switch_ms': switch * 1e3,
                        'dp_ms': statistics.median(dp_times) * 1e3,
                        'full_share': [float(v) for v in full_share],
                        'low_share': [float(v) for v in low_share]},
              'memory_mb': {'full': weight_bytes(full.model) / 2 ** 20,
                            'low': weight_bytes(low.model) / 2 ** 20},
              'pareto': pareto}
    out = Path(args.report)
    out.mkdir(parents=True, exist_ok=True)
    write_outputs(out, report, markdown, plot)
    return 0


if __name__ == '__main__':
    sys.exit(main())
