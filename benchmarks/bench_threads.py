# SPDX-License-Identifier: Apache-2.0
"""Decode-step and prefill time per precision, thread and intra-op thread count.

``python -m benchmarks.bench_threads`` times, for float32 and the int8-dynamic
copy the node keeps resident: the median decode step on the main thread and on a
second Python thread (where the node's worker decodes), with torch's default intra-op
thread count and with the count the node's ``decode_threads`` sets; and the prefill of
a few prompt lengths with 1 and with the default count. It is the regression check for
the int8 slowdown on a worker thread (``decode_threads``); results go to
results/threads.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import threading
import time

from benchmarks import harness


def decode_step_s(loaded, steps: int, threads: int) -> float:
    """Return the median decode-step time after a short prompt, at ``threads`` (0: as is)."""
    import torch
    from transformers import DynamicCache
    from timebill_ros.runtime.model import intra_op_threads, prompt_ids
    ids = torch.tensor([prompt_ids(loaded.tokenizer, 'Report the battery level.')])
    with torch.inference_mode(), intra_op_threads(threads):
        cache = DynamicCache()
        out = loaded.model(input_ids=ids, past_key_values=cache, use_cache=True)
        token = out.logits[:, -1:].argmax(-1)
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            out = loaded.model(input_ids=token, past_key_values=cache, use_cache=True)
            token = out.logits[:, -1:].argmax(-1)
            times.append(time.perf_counter() - start)
    return statistics.median(times[2:])


def prefill_s(loaded, length: int, threads: int, repeats: int = 3) -> float:
    """Return the fastest of ``repeats`` prefills of ``length`` tokens at ``threads``.

    Each is timed to the end of the device's work (CUDA runs kernels asynchronously).
    """
    import torch
    from transformers import DynamicCache
    from timebill_ros.runtime.model import intra_op_threads, synchronize
    ids = torch.randint(1000, 40000, (1, length), generator=torch.Generator().manual_seed(0))
    ids = ids.to(loaded.device)
    best = float('inf')
    with torch.inference_mode(), intra_op_threads(threads):
        for _ in range(repeats):
            synchronize(loaded.device)
            start = time.perf_counter()
            loaded.model(input_ids=ids, past_key_values=DynamicCache(), use_cache=True)
            synchronize(loaded.device)
            best = min(best, time.perf_counter() - start)
    return best


def on_worker(function, *args):
    """Run ``function(*args)`` on a fresh Python thread and return its result."""
    result = []
    worker = threading.Thread(target=lambda: result.append(function(*args)))
    worker.start()
    worker.join()
    return result[0]


def main(argv=None) -> int:
    """Measure and write the report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--model', default='embedded')
    parser.add_argument('--steps', type=int, default=40)
    parser.add_argument('--lengths', type=int, nargs='+', default=[64, 512, 2048])
    parser.add_argument('--decode-threads', type=int, default=1)
    parser.add_argument('--out', default=None,
                        help='file stem (default: results/threads-<UTC time>/threads)')
    args = parser.parse_args(argv)
    import torch
    from timebill_ros.runtime.model import load_model, precision_variant
    default = torch.get_num_threads()
    base = load_model(args.model)
    models = {'float32': base, 'int8-dynamic': precision_variant(base, 'int8-dynamic')}
    rows = []
    for name, loaded in models.items():
        decode_step_s(loaded, 4, 0)  # warm the kernels
        row = {'precision': name}
        for label, threads in ((f'{default} threads', 0),
                               (f'{args.decode_threads} thread(s)', args.decode_threads)):
            row[f'main, {label}'] = decode_step_s(loaded, args.steps, threads)
            row[f'worker, {label}'] = on_worker(decode_step_s, loaded, args.steps, threads)
        for length in args.lengths:
            for threads in (1, default):
                row[f'prefill {length}, {threads} thread(s)'] = on_worker(
                    prefill_s, loaded, length, threads)
        rows.append(row)
        print(row, flush=True)
    out = harness.claim_file(args.out, 'threads')
    out.with_suffix('.json').write_text(json.dumps(
        {'rows': rows, 'default_threads': default, 'machine': platform.node(),
         'date': time.strftime('%Y-%m-%d')}, indent=1) + '\n', encoding='utf-8')
    keys = [k for k in rows[0] if k != 'precision']
    lines = [f"# Decode step and prefill by thread ({time.strftime('%Y-%m-%d')})", '',
             f"`python -m benchmarks.bench_threads {' '.join(sys.argv[1:])}` on "
             f'{platform.node()} {platform.machine()}, torch default {default} intra-op '
             'threads. Decode: median step (ms) after a short prompt, on the main thread and '
             "on a second Python thread (the node's worker). Prefill: fastest of 3 (s), on "
             'a second thread.', '', '| measurement | ' + ' | '.join(
                 r['precision'] for r in rows) + ' |', '|---|' + '---|' * len(rows)]
    for key in keys:
        scale, unit = (1e3, 'ms') if not key.startswith('prefill') else (1.0, 's')
        lines.append(f'| {key} ({unit}) | ' + ' | '.join(
            f'{r[key] * scale:.3g}' for r in rows) + ' |')
    out.with_suffix('.md').write_text('\n'.join(lines) + '\n', encoding='utf-8')
    print('\n'.join(lines))
    return 0


if __name__ == '__main__':
    sys.exit(main())
