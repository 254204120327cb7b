"""Measure what context reduction keeps: right answers and prompt tokens per kept share.

``python -m timebill_ros.cli.measure_context_cut --items 16 --out results/context_cut/<run>``
answers long-context items (a fact planted in a robot log, SQuAD questions over their
article; ``evaluation.tasks``, seed 3: not the items ``bench_context`` holds out with
seed 7) with the embedded model, greedy, once with the whole context and once per share
of ``core.context.KEEP_SHARES`` (the sentences BM25 ranks closest to the instruction).
Per share: right answers, right answers among the items the whole context got right,
prompt tokens and prefill seconds. ``--ship`` also writes the fidelity table the node
reports in its plans (``timebill_ros/data/context_cut.json``): right answers kept with
the share over right answers with the whole context.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from timebill_ros.cli import common
from timebill_ros.cli.bench_context import correct
from timebill_ros.cli.measure_cuts import answer


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
    """Return per share: right, right of the whole's right ones, tokens and seconds."""
    whole = [row for row in rows if row['1']['right']]
    out = {}
    for share in (1.0, *shares):
        key = f'{share:g}'
        out[key] = {
            'right': sum(row[key]['right'] for row in rows),
            'kept_of_whole_right': sum(row[key]['right'] for row in whole),
            'whole_right': len(whole),
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
             'prompt tokens (mean) | answer s (mean) |', '|---|---|---|---|---|---|']
    for key, row in report['summary'].items():
        quality = row['kept_of_whole_right'] / row['whole_right'] if row['whole_right'] else 0
        lines.append(f"| {key} | {row['right']}/{report['items']} | "
                     f"{row['kept_of_whole_right']}/{row['whole_right']} | {quality:.2f} | "
                     f"{row['prompt_tokens']:.0f} | {row['seconds']:.2f} |")
    return '\n'.join(lines)


def main(argv=None) -> int:
    """Measure and write bench.json and README.md to a new folder (and the table)."""
    from timebill_ros.core.context import ContextCutTable, KEEP_SHARES, SHIPPED
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--items', type=int, default=16, help='half needles, half SQuAD')
    parser.add_argument('--seed', type=int, default=3, help='item selection (not 7)')
    parser.add_argument('--out', help=common.OUT_HELP)
    parser.add_argument('--ship', action='store_true',
                        help=f'also write the fidelity table to {SHIPPED}')
    args = parser.parse_args(argv)
    out = common.claim_out(args.out, 'context_cut')
    from timebill_ros.cli.bench_context import held_out_items
    from timebill_ros.runtime.engine import Engine
    from timebill_ros.runtime.model import load_model
    from timebill_ros.runtime.presses import press_for_plan
    log = common.stamped_log()
    loaded = load_model('embedded')
    engine = Engine(loaded, press_for_plan)
    items = held_out_items(args.items, loaded.tokenizer, args.seed)
    rows = measure(engine, loaded.tokenizer, items, KEEP_SHARES, log)
    report = {'command': 'python -m timebill_ros.cli.measure_context_cut '
                         + ' '.join(argv if argv is not None else sys.argv[1:]),
              'commit': common.commit(), 'machine': common.machine(),
              'date': time.strftime('%Y-%m-%d'), 'items': len(items), 'seed': args.seed,
              'summary': summary(rows, KEEP_SHARES), 'rows': rows}
    (out / 'bench.json').write_text(json.dumps(report, indent=1) + '\n', encoding='utf-8')
    text = markdown(report)
    (out / 'README.md').write_text(text + '\n', encoding='utf-8')
    print(text)
    if args.ship:
        whole = report['summary']['1']['whole_right']
        table = ContextCutTable(
            {share: report['summary'][f'{share:g}']['kept_of_whole_right'] / whole
             for share in KEEP_SHARES} if whole else {},
            f"{report['command']} ({report['commit']}, {report['date']})")
        table.save(SHIPPED)
    return 0


if __name__ == '__main__':
    sys.exit(main())
