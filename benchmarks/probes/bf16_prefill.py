# SPDX-License-Identifier: Apache-2.0
"""Time a prompt's prefill on the float32 model and on its resident bfloat16 copy.

``python -m benchmarks.probes.bf16_prefill`` prints, per prompt length, the median
seconds of the engine's chunked prefill under Plan() and under
Plan(prefill_precision='bfloat16'), and whether the CPU has bfloat16 matrix units (the
planner offers the copy's prefill only where its profiled prefill saves
min_cut_saving). Writes probe.json to ``--out`` (default: a new results folder).
Results: results/context/bf16_prefill.
"""

import argparse
import json
import platform
import statistics
import subprocess
import time

from benchmarks import harness
from timebill_ros.core.planning import Plan
from timebill_ros.runtime.engine import Engine
from timebill_ros.runtime.model import load_model, precision_variant

LENGTHS = (256, 1024, 2048)
REPEATS = 3


def flags() -> dict:
    """Return the CPU's model name and its bfloat16-relevant flags."""
    info = subprocess.run(['lscpu'], capture_output=True, text=True).stdout
    line = {k.strip(): v.strip() for k, v in
            (row.split(':', 1) for row in info.splitlines() if ':' in row)}
    have = set(line.get('Flags', '').split())
    return {'cpu': line.get('Model name', platform.processor()),
            **{flag: flag in have for flag in ('avx2', 'avx512f', 'avx512_bf16',
                                               'amx_bf16', 'amx_tile')}}


def main(argv=None) -> None:
    """Time both prefills at each length and write probe.json."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--out', help='probe.json to write (never overwritten)')
    out = harness.claim_file(parser.parse_args(argv).out, 'bf16_prefill_probe.json')
    loaded = load_model('embedded')
    engine = Engine(loaded, variants={'bfloat16': precision_variant(loaded, 'bfloat16')},
                    prefill_chunk=256)
    with loaded.tokenizer_lock:
        text = loaded.tokenizer(' '.join(['The forklift in aisle seven reports a '
                                          'battery at forty percent.'] * 400))['input_ids']
    plans = {'float32': Plan(),
             'bfloat16': Plan(precision='bfloat16', prefill_precision='bfloat16')}
    for plan in plans.values():  # first passes pay lazy initialisation
        engine.prefill(text[:64], plan)
    rows = []
    for n in LENGTHS:
        row = {'prompt_tokens': n}
        for name, plan in plans.items():
            times = []
            for _ in range(REPEATS):
                t0 = time.perf_counter()
                engine.prefill(text[:n], plan)
                times.append(time.perf_counter() - t0)
            row[name] = statistics.median(times)
        row['bfloat16_over_float32'] = row['bfloat16'] / row['float32']
        rows.append(row)
        print(f"{n:5d} tokens: float32 {row['float32']:.3f} s, bfloat16 copy "
              f"{row['bfloat16']:.3f} s ({row['bfloat16_over_float32']:.2f}x)", flush=True)
    report = {'date': time.strftime('%Y-%m-%dT%H:%M:%S%z'), 'machine': flags(),
              'torch_threads': __import__('torch').get_num_threads(), 'rows': rows}
    print(json.dumps(report['machine']))
    out.write_text(json.dumps(report, indent=1) + '\n')


if __name__ == '__main__':
    main()
