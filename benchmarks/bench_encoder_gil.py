# SPDX-License-Identifier: Apache-2.0
"""The text length head's encoder beside busy Python threads: eager against traced.

``python -m benchmarks.bench_encoder_gil`` times one MiniLM forward over a batch
of goal texts (the node's admission in front of vLLM replicas) with 0, 2 and 6 Python
threads spinning beside it, as the node's streams, feedback and executor threads do.
An eager forward takes the GIL back after each of its ops; the traced one the node runs
(``runtime.predictor.traced_encoder``) gives it up once. Results go to a new folder:
bench.json and README.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time

from benchmarks import common, harness


def _spin(stop: threading.Event) -> None:
    total = 0
    while not stop.is_set():
        for i in range(1000):
            total += i * i


def forward_ms(forward, repeats: int) -> dict:
    """Return the median and worst of ``repeats`` calls of ``forward``, in ms."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        forward()
        times.append(1e3 * (time.perf_counter() - start))
    return {'median_ms': round(statistics.median(times), 1), 'worst_ms': round(max(times), 1)}


def measure(texts: int, busy_counts: list, repeats: int) -> list:
    """Return one row per busy-thread count: eager and traced forward times."""
    import torch
    from timebill_ros.runtime.length_encoder import load_minilm
    from timebill_ros.runtime.model import intra_op_threads
    from timebill_ros.runtime.predictor import traced_encoder
    tokenizer, eager = load_minilm()
    traced = traced_encoder(eager, tokenizer)
    enc = tokenizer([f'Write a detailed essay about robot number {i}.' for i in range(texts)],
                    padding=True, return_tensors='pt')

    def run(model):
        def forward():
            with intra_op_threads(1), torch.inference_mode():
                model(enc['input_ids'], enc['attention_mask'])
        return forward
    rows = []
    for busy in busy_counts:
        stop = threading.Event()
        spinners = [threading.Thread(target=_spin, args=(stop,), daemon=True)
                    for _ in range(busy)]
        for spinner in spinners:
            spinner.start()
        try:
            rows.append({'busy_threads': busy, 'eager': forward_ms(run(eager), repeats),
                         'traced': forward_ms(run(traced), repeats)})
        finally:
            stop.set()
            for spinner in spinners:
                spinner.join(10)
        print(rows[-1], flush=True)
    return rows


def markdown(report: dict) -> str:
    """Return the README table."""
    lines = [f"# MiniLM forward beside busy Python threads ({report['date']})", '',
             f"`{report['command']}` at {report['commit']} on {report['machine']}; "
             f"{report['texts']} texts in one padded batch, one intra-op thread, "
             f"{report['repeats']} forwards each.", '',
             '| busy Python threads | eager median (worst) ms | traced median (worst) ms |',
             '|---|---|---|']
    for row in report['rows']:
        eager, traced = row['eager'], row['traced']
        lines.append(f"| {row['busy_threads']} | {eager['median_ms']} ({eager['worst_ms']}) "
                     f"| {traced['median_ms']} ({traced['worst_ms']}) |")
    return '\n'.join(lines)


def main(argv=None) -> int:
    """Run the measurement and write the results folder."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--texts', type=int, default=9, help='goal texts in the batch')
    parser.add_argument('--busy', default='0,2,6', help='busy Python thread counts')
    parser.add_argument('--repeats', type=int, default=7, help='forwards per cell')
    parser.add_argument('--out', help=harness.OUT_HELP)
    args = parser.parse_args(argv)
    out = harness.claim_out(args.out, 'encoder_gil')
    rows = measure(args.texts, [int(n) for n in args.busy.split(',')], args.repeats)
    given = sys.argv[1:] if argv is None else argv
    report = {'command': ' '.join(['python -m benchmarks.bench_encoder_gil', *given]),
              'commit': common.commit(), 'date': time.strftime('%Y-%m-%d %H:%M UTC',
                                                               time.gmtime()),
              'machine': common.machine(), 'texts': args.texts, 'repeats': args.repeats,
              'rows': rows}
    harness.write_outputs(out, report, markdown, lambda report, out: None)
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
