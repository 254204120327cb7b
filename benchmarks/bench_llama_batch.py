# SPDX-License-Identifier: Apache-2.0
"""bench_llama_batch: llama.cpp decode steps with 1..N sequences in one batch, per format.

The node's own llama.cpp context (runtime/llama_engine.LlamaModel, one KV stream a
sequence, the machine's cores) on the embedded model's GGUF variants: each sequence
holds a prompt of ``--prompt`` tokens, then ``--steps`` decode steps feed one token to
each of the first N sequences in one ``llama_decode``. The median step, and the
throughput gain N x step(1) / step(N), say whether batching goals pays on this machine
and how much of an 8-token goal it can save (its prefill is not batched).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from benchmarks import common, harness


def step_times(model, sequences: int, prompt: int, steps: int) -> dict:
    """Return {N: median step seconds} and the prompt's prefill seconds on one sequence."""
    seqs = [model.acquire() for _ in range(sequences)]
    ids = [100 + i for i in range(prompt)]
    began = time.perf_counter()
    for seq in seqs:
        model.decode([(token, i, seq, i == prompt - 1) for i, token in enumerate(ids)])
    prefill_s = (time.perf_counter() - began) / sequences
    medians = {}
    for size in range(1, sequences + 1):
        times = []
        for k in range(steps):
            began = time.perf_counter()
            model.decode([(200 + k, prompt + k, seq, True) for seq in seqs[:size]])
            times.append(time.perf_counter() - began)
        for seq in seqs:
            model.crop(seq, prompt)
        medians[size] = statistics.median(times)
    for seq in seqs:
        model.release(seq)
    return {'prefill_s': prefill_s, 'step_s': medians}


def markdown(report: dict) -> str:
    """Render one table per format."""
    lines = [f"# llama.cpp batched decode steps ({report['date']}, {report['machine']})", '',
             f"Command: `{report['command']}` (commit {report['commit']}). Prompt "
             f"{report['prompt']} tokens a sequence, {report['steps']} steps a size, "
             f"{report['threads']} threads.", '']
    for name, row in report['formats'].items():
        one = row['step_s'][1]
        lines += [f"## {name}: prefill of {report['prompt']} tokens {1e3 * row['prefill_s']:.1f}"
                  ' ms', '', '| sequences | step ms | tokens/s | throughput x one |',
                  '|---|---|---|---|']
        for size, step in row['step_s'].items():
            lines.append(f'| {size} | {1e3 * step:.2f} | {size / step:.0f} | '
                         f'{size * one / step:.2f} |')
        lines.append('')
    return '\n'.join(lines)


def main(argv=None) -> int:
    """Time each format's batched steps and write the results folder."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--formats', nargs='+', default=['q4_1', 'f16'])
    parser.add_argument('--sequences', type=int, default=4)
    parser.add_argument('--prompt', type=int, default=60)
    parser.add_argument('--steps', type=int, default=40)
    parser.add_argument('--out', help=harness.OUT_HELP)
    args = parser.parse_args(argv)
    out = harness.claim_out(args.out, 'llama_batch')
    from timebill_ros.runtime.llama_engine import gguf_variant, LlamaModel
    from timebill_ros.runtime.model import cache_root, embedded_gguf
    threads = os.cpu_count()
    report = {**common.run_header('benchmarks.bench_llama_batch', argv),
              'prompt': args.prompt, 'steps': args.steps, 'threads': threads, 'formats': {}}
    for name in args.formats:
        model = LlamaModel(gguf_variant(embedded_gguf(), name, cache_root()),
                           args.prompt + args.steps + 8, args.sequences, 64, threads)
        try:
            first = model.acquire()
            model.decode([(100, 0, first, True)])  # first-call costs
            model.release(first)
            report['formats'][name] = step_times(model, args.sequences, args.prompt,
                                                 args.steps)
        finally:
            model.close()
    harness.write_outputs(out, report, markdown, lambda report, out: None)
    print(markdown(report))
    return 0


if __name__ == '__main__':
    sys.exit(main())
