# SPDX-License-Identifier: Apache-2.0
"""Early exit on the embedded model: layer ablation, threshold choice and a deadline sweep.

``python -m benchmarks.bench_early_exit`` (``--quick`` for a smoke run).

A. Layer ablation (logit lens: final norm + LM head on layer l's hidden state). For
   each prompt the full-depth greedy answer is generated; one teacher-forced forward
   with all hidden states then gives, per layer and answer token, the lens's top-1
   token and confidence. Reported per layer: top-1 agreement with the full model
   overall, and among tokens whose confidence reaches a threshold (with the share
   of tokens that reach it), plus the time a token saves by exiting there (per-layer
   timings measured on this device). Prompts are split in two: thresholds are chosen
   on the first half (smallest grid value whose agreement reaches --target) and
   reported on the held-out second half. Default exit layers: the two with the
   largest expected saving (held-out coverage x time saved) among layers that keep
   held-out agreement >= target.
B. Deadline sweep: decode every prompt with a per-token deadline D (several
   multiples of the measured full-depth step), exits at the chosen layers with a
   threshold decaying 0.8 -> 0.3 over the token's time, forced exits when the
   remaining layers cannot fit. Reported per D: shares of full-depth, threshold and
   forced exits, per-token deadline-miss rate, mean and P99 TPOT, utilisation
   U = P99 TPOT / D, and quality against the full-depth output (token agreement and
   ROUGE-L) and against the references (task metric).
Writes results/early_exit.{md,json} and results/early_exit_sweep.png.
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path
import shlex
import statistics
import sys
import time

from benchmarks import harness
from benchmarks.common import machine
from timebill_ros.evaluation import metrics, tasks
from timebill_ros.serving.loop import generate

THRESHOLDS = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


def full_answer(loaded, ids: list, max_new: int) -> list:
    """Return the full-depth greedy answer token ids (EOS excluded)."""
    from timebill_ros.core.planning import Plan
    from timebill_ros.runtime.engine import Engine
    tokens = []
    generate(Engine(loaded), ids, max_new, Plan(), lambda e: tokens.append(e.token_id) or True)
    return tokens


def lens_table(loaded, ids: list, answer: list, heads=None) -> dict:
    """Return {(layer, 'lens'|'head'): (agree per token, confidence per token)}."""
    import torch
    model = loaded.model
    with torch.inference_mode():
        seq = torch.tensor([ids + answer])
        states = model(input_ids=seq, output_hidden_states=True).hidden_states
        n = len(ids)
        positions = slice(n - 1, n - 1 + len(answer))
        target = torch.tensor(answer)
        table = {}
        for layer in range(1, loaded.num_layers):
            variants = [('lens', model.model.norm(states[layer][0, positions]))]
            if heads is not None and layer in heads.maps:
                variants.append(('head', heads.apply(layer, states[layer][0, positions])))
            for kind, mapped in variants:
                probs = torch.softmax(model.lm_head(mapped).float(), dim=-1)
                c, best = probs.max(dim=-1)
                table[(layer, kind)] = ((best == target).tolist(), c.tolist())
    return table


def choose_threshold(agree: list, conf: list, target: float):
    """Return the smallest grid threshold whose agreement above it reaches ``target``."""
    for tau in THRESHOLDS:
        above = [a for a, c in zip(agree, conf) if c >= tau]
        if above and sum(above) / len(above) >= target:
            return tau
    return None


def at_threshold(agree: list, conf: list, tau) -> tuple:
    """Return (coverage, agreement among covered) at threshold ``tau``."""
    if tau is None or not agree:
        return 0.0, float('nan')
    above = [a for a, c in zip(agree, conf) if c >= tau]
    return len(above) / len(agree), (sum(above) / len(above) if above else float('nan'))


def sweep_one(loaded, decoder, ids: list, max_new: int, budget_s: float) -> dict:
    """Decode one prompt through the node's Engine with early exits and a per-token budget.

    Returns the answer tokens, the exit kind and the time of every decode step.
    """
    from timebill_ros.core.planning import Plan
    from timebill_ros.core.request import Mode
    from timebill_ros.runtime.engine import Engine
    tokens = []
    stats = generate(Engine(loaded, exit_decoder=decoder), ids, max_new,
                     Plan(mode=Mode.EARLY_EXIT), lambda e: tokens.append(e.token_id) or True,
                     token_budget=lambda index: budget_s)
    return {'tokens': tokens, 'kinds': stats.exit_kinds, 'times': stats.step_times}


def token_agreement(a: list, b: list) -> float:
    """Return the share of positions where two token sequences agree (over the longer)."""
    if not a and not b:
        return 1.0
    same = sum(x == y for x, y in zip(a, b))
    return same / max(len(a), len(b))


def parse_args(argv=None) -> argparse.Namespace:
    """Parse the command line."""
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--quick', action='store_true', help='4 prompts, 3 deadlines')
    parser.add_argument('--prompts', type=int, default=12, help='prompts (half held out)')
    parser.add_argument('--max-new', type=int, default=32, help='answer tokens per prompt')
    parser.add_argument('--target', type=float, default=0.9,
                        help='agreement the chosen threshold must reach on the fit half')
    parser.add_argument('--out', default=None, help=harness.OUT_HELP)
    return parser.parse_args(argv)


def main(argv=None) -> int:
    """Run the ablation and the sweep; write markdown, JSON and a PNG."""
    args = parse_args(argv)
    n_prompts = 4 if args.quick else args.prompts
    started = time.monotonic()
    from timebill_ros.core.early_exit import ExitRule, FORCED, FULL, THRESHOLD
    from timebill_ros.core.telemetry import percentile
    from timebill_ros.runtime.early_exit import LayerwiseDecoder, measure_layer_times
    from timebill_ros.runtime.exit_heads import ExitHeads, SHIPPED_EXIT_HEADS
    from timebill_ros.runtime.model import load_model, prompt_ids
    loaded = load_model('embedded')
    half = n_prompts // 2
    items = tasks.select('squad', loaded.tokenizer, half, 300, 900) + \
        tasks.select('cnndm', loaded.tokenizer, n_prompts - half, 300, 1200)
    # Interleave tasks so that both halves (fit / held out) hold both tasks.
    items = [x for pair in zip(items[:half], items[half:]) for x in pair] + items[2 * half:]
    prompts = [prompt_ids(loaded.tokenizer, i.instruction, i.context) for i in items]
    answers = [full_answer(loaded, ids, args.max_new) for ids in prompts]
    print(f'{len(items)} prompts, full answers done ({time.monotonic() - started:.0f} s)',
          flush=True)

    L = loaded.num_layers
    heads = ExitHeads.load(SHIPPED_EXIT_HEADS) if SHIPPED_EXIT_HEADS.is_file() else None
    fit_idx = list(range(0, len(items), 2))
    agree = {}
    for index, (ids, answer) in enumerate(zip(prompts, answers)):
        if not answer:
            continue
        part = 'fit' if index in fit_idx else 'held'
        for key, (a, c) in lens_table(loaded, ids, answer, heads).items():
            slot = agree.setdefault(key, {'fit': ([], []), 'held': ([], [])})
            slot[part][0].extend(a)
            slot[part][1].extend(c)
    times = measure_layer_times(loaded, n_kv=512, steps=8)
    rows = []
    for (layer, kind) in sorted(agree):
        fa, fc = agree[(layer, kind)]['fit']
        ha, hc = agree[(layer, kind)]['held']
        every_a, every_c = fa + ha, fc + hc
        tau = choose_threshold(fa, fc, args.target)
        coverage, held_agree = at_threshold(ha, hc, tau)
        row = {'layer': layer, 'exit': kind, 'tokens': len(every_a),
               'agree_all': sum(every_a) / max(1, len(every_a)),
               'agree_conf_ge_0.5': at_threshold(every_a, every_c, 0.5)[1],
               'coverage_conf_ge_0.5': at_threshold(every_a, every_c, 0.5)[0],
               'threshold': tau, 'heldout_coverage': coverage, 'heldout_agree': held_agree,
               'time_saved': 1.0 - times.until(layer) / times.full_s}
        row['expected_saving'] = row['heldout_coverage'] * row['time_saved'] \
            if held_agree == held_agree and held_agree >= args.target - 0.05 else 0.0
        rows.append(row)
    ranked = sorted((r for r in rows if r['expected_saving'] > 0),
                    key=lambda r: -r['expected_saving'])
    chosen = {}
    for r in ranked:  # best variant per layer, two layers at most
        if r['layer'] not in chosen and len(chosen) < 2:
            chosen[r['layer']] = r['exit']
    exit_layers = tuple(sorted(chosen)) or (L - 2,)
    use_heads = {layer for layer, kind in chosen.items() if kind == 'head'}
    print(f'layer ablation done; exit layers {exit_layers} ({time.monotonic() - started:.0f} s)',
          flush=True)

    # B. Deadline sweep.
    rule = ExitRule(exit_layers, 0.8, 0.3)
    head_maps = ExitHeads(heads.target, {k: v for k, v in heads.maps.items() if k in use_heads}) \
        if heads is not None and use_heads else None
    decoder = LayerwiseDecoder(loaded, rule, times, heads=head_maps)
    full_step = statistics.median(
        s for ids in prompts[:2] for s in sweep_one(
            loaded, LayerwiseDecoder(loaded, None, None), ids, 8, None)['times'])
    factors = (0.6, 0.9, 1.3) if args.quick else (0.5, 0.7, 0.85, 1.0, 1.3, 2.0)
    sweep = []
    for factor in factors:
        budget = full_step * factor
        runs = [sweep_one(loaded, decoder, ids, args.max_new, budget) for ids in prompts]
        steps = [t for r in runs for t in r['times']]
        kinds = [k for r in runs for k in r['kinds']]
        p99 = percentile(steps, 99)
        quality = [metrics.score(i.metric, loaded.tokenizer.decode(r['tokens']), i.references)
                   for i, r in zip(items, runs)]
        vs_full = [metrics.rouge_l(loaded.tokenizer.decode(r['tokens']),
                                   loaded.tokenizer.decode(a)) for r, a in zip(runs, answers)]
        sweep.append({
            'deadline_s': budget, 'deadline_x_full_step': factor, 'steps': len(steps),
            'share_full': kinds.count(FULL) / max(1, len(kinds)),
            'share_threshold': kinds.count(THRESHOLD) / max(1, len(kinds)),
            'share_forced': kinds.count(FORCED) / max(1, len(kinds)),
            'miss_rate': sum(t > budget for t in steps) / max(1, len(steps)),
            'tpot_mean_s': statistics.mean(steps) if steps else float('nan'),
            'tpot_p99_s': p99, 'utilisation': p99 / budget,
            'token_agreement_vs_full': statistics.mean(
                token_agreement(r['tokens'], a) for r, a in zip(runs, answers)),
            'rougeL_vs_full': statistics.mean(vs_full),
            'task_score': statistics.mean(quality)})
        print(f'D = {factor:g} x full step: done', flush=True)
    # C. Quality effect of the K/V fill alone, with mixed exits (fixed threshold 0.8, no
    # time pressure, so both runs take the same decisions until their tokens differ):
    # skipped layers get K/V from the exit state (CALM) or from really running them.
    # (If every token exited at the same layer, the deeper K/V would never be read.)
    always = ExitRule((exit_layers[0],), 0.8, 0.8)
    kv_effect = {}
    for name, exact in (('calm_fill', False), ('exact_kv', True)):
        dec = LayerwiseDecoder(loaded, always, times, heads=head_maps, exact_kv=exact)
        runs = [sweep_one(loaded, dec, ids, args.max_new, None) for ids in prompts]
        kv_effect[name] = {
            'token_agreement_vs_full': statistics.mean(
                token_agreement(r['tokens'], a) for r, a in zip(runs, answers)),
            'rougeL_vs_full': statistics.mean(
                metrics.rouge_l(loaded.tokenizer.decode(r['tokens']),
                                loaded.tokenizer.decode(a)) for r, a in zip(runs, answers)),
            'task_score': statistics.mean(
                metrics.score(i.metric, loaded.tokenizer.decode(r['tokens']), i.references)
                for i, r in zip(items, runs))}
    print('K/V fill effect done', flush=True)
    full_quality = statistics.mean(
        metrics.score(i.metric, loaded.tokenizer.decode(a), i.references)
        for i, a in zip(items, answers))
    report = {
        'date': datetime.date.today().isoformat(), 'machine': machine(),
        'command': 'python -m benchmarks.bench_early_exit ' + ' '.join(
            shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])),
        'model': loaded.name, 'layers': L, 'prompts': len(items),
        'items': [{'task': i.task, 'id': i.item_id, 'prompt_tokens': i.prompt_tokens}
                  for i in items],
        'max_new_tokens': args.max_new, 'target': args.target,
        'layer_times_ms': [t * 1e3 for t in times.layers], 'head_ms': times.head_s * 1e3,
        'full_step_s': full_step, 'ablation': rows, 'exit_layers': list(exit_layers),
        'exit_kinds': {str(k): v for k, v in chosen.items()},
        'exit_heads': str(SHIPPED_EXIT_HEADS.name) if heads is not None else None,
        'full_depth_task_score': full_quality, 'sweep': sweep, 'kv_effect': kv_effect,
        'wall_min': (time.monotonic() - started) / 60.0}
    out = harness.claim_out(args.out, 'early_exit')
    (out / 'early_exit.json').write_text(json.dumps(report, indent=1) + '\n')
    (out / 'early_exit.md').write_text(markdown(report))
    plot(report, out / 'early_exit_sweep.png')
    print((out / 'early_exit.md').read_text())
    return 0


def _f(value, fmt='{:.2f}') -> str:
    return '-' if value is None or value != value else fmt.format(value)


def markdown(report: dict) -> str:
    """Render the report as markdown."""
    lines = [f"# Early exit on {report['model']} ({report['date']}, {report['machine']})", '',
             f"Command: `{report['command']}`; {report['prompts']} prompts (SQuAD + CNN/DM), "
             f"{report['max_new_tokens']} answer tokens each; wall {report['wall_min']:.1f} min.",
             '', f"Per-layer time {statistics.mean(report['layer_times_ms']):.2f} ms (mean), "
             f"LM head {report['head_ms']:.2f} ms; full-depth step "
             f"{report['full_step_s'] * 1e3:.1f} ms (layer-by-layer).", '',
             '## A. Layer ablation (logit lens)', '',
             f"Threshold: smallest of {THRESHOLDS} with agreement >= {report['target']:g} on "
             'the fit half; held-out columns on the other half.', '',
             '| layer | exit | agree (all) | agree (conf>=0.5) | share conf>=0.5 | threshold | '
             'held-out share | held-out agree | time saved |',
             '|---|---|---|---|---|---|---|---|---|']
    for r in report['ablation']:
        lines.append(f"| {r['layer']} | {r['exit']} | {_f(r['agree_all'])} | "
                     f"{_f(r['agree_conf_ge_0.5'])} | "
                     f"{_f(r['coverage_conf_ge_0.5'])} | {_f(r['threshold'], '{:g}')} | "
                     f"{_f(r['heldout_coverage'])} | {_f(r['heldout_agree'])} | "
                     f"{_f(r['time_saved'], '{:.0%}')} |")
    lines += ['', f"Chosen exit layers: {report['exit_layers']} "
              f"(exit per layer: {report['exit_kinds'] or 'none qualified; fallback lens'}). "
              "'lens' = final norm + LM head on the layer's state; 'head' = the trained "
              f"exit map ({report['exit_heads']}, training.train_exit_heads) then the "
              'LM head. Time saved = 1 - (layers up to the exit + one LM head) / full step.',
              '',
              '## B. Deadline sweep (threshold 0.8 -> 0.3 over the token budget, forced exits)',
              '', f"Full-depth answers' task score: {report['full_depth_task_score']:.3f}.", '',
              '| D (x full step) | D ms | full | threshold | forced | miss rate | mean TPOT ms |'
              ' P99 TPOT ms | U | token agree vs full | ROUGE-L vs full | task score |',
              '|---|---|---|---|---|---|---|---|---|---|---|---|']
    for s in report['sweep']:
        lines.append(
            f"| {s['deadline_x_full_step']:g} | {s['deadline_s'] * 1e3:.1f} | "
            f"{s['share_full']:.0%} | {s['share_threshold']:.0%} | {s['share_forced']:.0%} | "
            f"{s['miss_rate']:.0%} | {s['tpot_mean_s'] * 1e3:.1f} | "
            f"{s['tpot_p99_s'] * 1e3:.1f} | {s['utilisation']:.2f} | "
            f"{s['token_agreement_vs_full']:.2f} | {s['rougeL_vs_full']:.2f} | "
            f"{s['task_score']:.3f} |")
    kv = report.get('kv_effect')
    if kv:
        lines += ['', f"## C. Quality effect of the K/V fill (mixed exits: layer "
                  f"{report['exit_layers'][0]} at confidence >= 0.8, else full depth)", '',
                  '| skipped layers get K/V from | token agree vs full | ROUGE-L vs full | '
                  'task score |', '|---|---|---|---|']
        for name, label in (('calm_fill', 'the exit state (CALM fill, what the node does)'),
                            ('exact_kv', 'running the skipped layers (exact, no saving)')):
            row = kv[name]
            lines.append(f"| {label} | {row['token_agreement_vs_full']:.2f} | "
                         f"{row['rougeL_vs_full']:.2f} | {row['task_score']:.3f} |")
    return '\n'.join(lines) + '\n'


def plot(report: dict, path: Path) -> None:
    """Plot exit shares, miss rate and quality against the per-token deadline."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    xs = [s['deadline_x_full_step'] for s in report['sweep']]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for key, label in (('share_full', 'full depth'), ('share_threshold', 'threshold exit'),
                       ('share_forced', 'forced exit'), ('miss_rate', 'deadline miss')):
        left.plot(xs, [s[key] for s in report['sweep']], '-o', label=label)
    left.set_xlabel('per-token deadline D (x full-depth step)')
    left.set_ylabel('share of tokens')
    left.legend()
    left.grid(alpha=0.3)
    for key, label in (('token_agreement_vs_full', 'token agreement vs full'),
                       ('rougeL_vs_full', 'ROUGE-L vs full'), ('task_score', 'task score')):
        right.plot(xs, [s[key] for s in report['sweep']], '-s', label=label)
    right.set_xlabel('per-token deadline D (x full-depth step)')
    right.set_ylim(-0.02, 1.02)
    right.legend()
    right.grid(alpha=0.3)
    fig.suptitle(f"Early exit, {report['model']} ({report['date']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == '__main__':
    sys.exit(main())
