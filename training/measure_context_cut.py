# SPDX-License-Identifier: Apache-2.0
"""Measure what context reduction keeps: right answers and prompt tokens per kept share.

``python -m training.measure_context_cut --items 16 --out results/context_cut/<run>``
answers long-context items (a fact planted in a robot log, SQuAD questions over their
article; ``evaluation.tasks``, seed 3: not the items ``bench_context`` holds out with
seed 7) with the embedded model, greedy, once with the whole context and once per share
of ``core.context.KEEP_SHARES`` (the sentences BM25 ranks closest to the instruction).
Per share: right answers, right answers among the items the whole context got right,
likeness (mean ROUGE-L of its answer to the whole context's), prompt tokens and prefill
seconds. ``--ship`` also writes the table the node plans with
(``timebill_ros/data/context_cut.json``): the likeness, which the planner weighs like a
cut's fidelity, and right answers kept with the share over right answers with the whole
context, which its plans report. ``--reuse`` summarises a run's stored answers again.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
import sys
import time

from benchmarks import common, harness
from benchmarks.bench_context import correct
from training.measure_cuts import answer
from timebill_ros.core.context import ContextCutTable, KEEP_SHARES, SHIPPED


def measure(engine, tokenizer, items, shares, log) -> list:
    """Return one row per item: whole context and each share (tokens, right, prefill s)."""
    from timebill_ros.core.context import reduce_context
    from timebill_ros.core.planning import Plan
    from timebill_ros.runtime.model import prompt_ids
    rows = []
    for number, item in enumerate(items, 1):
        row = {'item': item.item_id, 'task': item.task}
        for share in (1.0, *shares):
            context = reduce_context(item.context, item.instruction, share).text
            ids = prompt_ids(tokenizer, item.instruction, context)
            started = time.monotonic()
            text, tokens = answer(engine, ids, Plan(), item.max_new_tokens)
            row[f'{share:g}'] = {'prompt_tokens': len(ids), 'tokens': tokens, 'text': text,
                                 's': time.monotonic() - started,
                                 'right': correct(item, text)}
        rows.append(row)
        log(f'[{number}/{len(items)}] {item.item_id}: ' + ', '.join(
            f"{k} {v['prompt_tokens']} tok {'right' if v['right'] else 'wrong'}"
            for k, v in row.items() if isinstance(v, dict)))
    return rows


def summary(rows: list, shares) -> dict:
    """Return per share: right, right of the whole's right ones, likeness, tokens, seconds.

    Likeness: mean ROUGE-L of the share's answer to the whole context's, over every item
    (the measure of every cut's fidelity in measure_cuts).
    """
    from timebill_ros.evaluation.metrics import rouge_l
    whole = [row for row in rows if row['1']['right']]
    out = {}
    for share in (1.0, *shares):
        key = f'{share:g}'
        out[key] = {
            'right': sum(row[key]['right'] for row in rows),
            'kept_of_whole_right': sum(row[key]['right'] for row in whole),
            'whole_right': len(whole),
            'likeness': sum(rouge_l(row[key]['text'], row['1']['text'])
                            for row in rows) / len(rows),
            'prompt_tokens': sum(row[key]['prompt_tokens'] for row in rows) / len(rows),
            'seconds': sum(row[key]['s'] for row in rows) / len(rows)}
    return out


def markdown(report: dict) -> str:
    """Return the run's README: the table per share."""
    lines = [f"# Context reduction on held-apart long-context items ({report['date']})", '',
             f"Command: `{report['command']}` (commit {report['commit']}); machine: "
             f"{report['machine']}; {report['items']} items (seed {report['seed']}), "
             'embedded model, torch float32, greedy.', '',
             '| kept share | right | right of the whole context\'s right | quality | '
             'likeness (ROUGE-L to the whole\'s answer) | prompt tokens (mean) | '
             'answer s (mean) |', '|---|---|---|---|---|---|---|']
    for key, row in report['summary'].items():
        quality = row['kept_of_whole_right'] / row['whole_right'] if row['whole_right'] else 0
        lines.append(f"| {key} | {row['right']}/{report['items']} | "
                     f"{row['kept_of_whole_right']}/{row['whole_right']} | {quality:.2f} | "
                     f"{row['likeness']:.2f} | {row['prompt_tokens']:.0f} | "
                     f"{row['seconds']:.2f} |")
    return '\n'.join(lines)


def answer_items(count: int, seed: int) -> list:
    """Answer ``count`` held-apart items with each context share; return their rows."""
    from benchmarks.bench_context import held_out_items
    from timebill_ros.runtime.engine import Engine
    from timebill_ros.runtime.model import load_model
    from timebill_ros.runtime.presses import press_for_plan
    loaded = load_model('embedded')
    items = held_out_items(count, loaded.tokenizer, seed)
    return measure(Engine(loaded, press_for_plan), loaded.tokenizer, items, KEEP_SHARES,
                   common.stamped_log())


def ship(report: dict) -> None:
    """Write the run's table to the shipped file (right answers kept and likeness)."""
    per_share = {share: report['summary'][f'{share:g}'] for share in KEEP_SHARES}
    whole = report['summary']['1']['whole_right']
    ContextCutTable(
        {share: row['kept_of_whole_right'] / whole for share, row in per_share.items()}
        if whole else {}, f"{report['command']} ({report['commit']}, {report['date']})",
        {share: row['likeness'] for share, row in per_share.items()}).save(SHIPPED)


def main(argv=None) -> int:
    """Measure and write bench.json and README.md to a new folder (and the table)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--items', type=int, default=16, help='half needles, half SQuAD')
    parser.add_argument('--seed', type=int, default=3, help='item selection (not 7)')
    parser.add_argument('--out', help=harness.OUT_HELP)
    parser.add_argument('--ship', action='store_true',
                        help=f'also write the fidelity table to {SHIPPED}')
    parser.add_argument('--reuse', default='',
                        help="a run's bench.json: summarise its answers again (no model runs)")
    args = parser.parse_args(argv)
    out = harness.claim_out(args.out, 'context_cut')
    command = 'python -m training.measure_context_cut ' + ' '.join(
        argv if argv is not None else sys.argv[1:])
    if args.reuse:
        earlier = json.loads(Path(args.reuse).read_text(encoding='utf-8'))
        rows, seed = earlier['rows'], earlier['seed']
        command += f" (answers of {earlier['command']} at {earlier['commit']})"
    else:
        rows, seed = answer_items(args.items, args.seed), args.seed
    report = {'command': command, 'commit': common.commit(), 'machine': common.machine(),
              'date': time.strftime('%Y-%m-%d'), 'items': len(rows), 'seed': seed,
              'summary': summary(rows, KEEP_SHARES), 'rows': rows}
    (out / 'bench.json').write_text(json.dumps(report, indent=1) + '\n', encoding='utf-8')
    text = markdown(report)
    (out / 'README.md').write_text(text + '\n', encoding='utf-8')
    print(text)
    if args.ship:
        ship(report)
    return 0


if __name__ == '__main__':
    sys.exit(main())
