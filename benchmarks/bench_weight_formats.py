# SPDX-License-Identifier: Apache-2.0
"""Decode-step and prefill time of the embedded model per weight format, on this machine.

``python -m benchmarks.bench_weight_formats`` builds, from the float32 model, the
copies the node can keep resident (``precision_variant``: int8-dynamic with torch.ao
per-channel scales and weight-only int8-weight on a CPU, bfloat16, float16 on CUDA) and,
when torchao is importable, torchao's int8 weight-only and int8 dynamic-activation
formats (eager, no torch.compile: the node does not compile). It times the median decode
step at two KV lengths and a prefill, format after format in rounds so a drift of the
machine's speed lands on all, and measures each format's next-token KL divergence from
float32 (``runtime.precision.next_token_kl``: the prompt's last position and the next
four greedy ones, on ``--kl-prompts`` robot-workload train items) and how each decode
step splits into weight matmuls and other ops (``matmul_split``). It is the measurement
behind the choice of the int8 library and of the decode precisions (README,
"Precision").
Outputs: results/weight_formats.{md,json}.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import statistics
import sys

from benchmarks import harness

TORCHAO = {'torchao int8 weight-only': 'Int8WeightOnlyConfig',
           'torchao int8 dyn-act int8 weight': 'Int8DynamicActivationInt8WeightConfig'}


def formats(full) -> dict:
    """Return {name: LoadedModel} for every format this environment and device can build.

    The node's own copies come from ``precision_variant`` (int8-dynamic on a CPU,
    bfloat16 anywhere, float16 on CUDA); those it refuses here are left out.
    """
    from timebill_ros.runtime.model import ModelLoadError, precision_variant
    built = {'float32': full}
    names = {'int8-dynamic': 'int8-dynamic (torch.ao)',
             'int8-weight': 'int8-weight (aten int8pack)'}
    for dtype in ('int8-dynamic', 'int8-weight', 'bfloat16', 'float16'):
        try:
            variant = precision_variant(full, dtype)
        except ModelLoadError:
            continue
        built[names.get(dtype, dtype)] = variant
    try:
        import torchao
        from torchao import quantization
    except ImportError:
        return built
    from dataclasses import replace
    for name, config in TORCHAO.items():
        model = copy.deepcopy(full.model)
        quantization.quantize_(model, getattr(quantization, config)())
        built[f'{name} ({torchao.__version__})'] = replace(full, model=model.eval())
    return built


def divergences(built: dict, prompts: int) -> dict:
    """Return {name: mean next-token KL(float32 || format)} on robot train prompts."""
    if prompts <= 0:
        return {}
    import torch
    from timebill_ros.evaluation import robot_workload
    from timebill_ros.runtime.model import prompt_ids
    from timebill_ros.runtime.precision import next_token_kl, reference_logp
    full = built['float32']
    items = robot_workload.load('train')[::7][:prompts]
    ids = [prompt_ids(full.tokenizer, item.instruction, item.context) for item in items]
    ids_list, refs = reference_logp(full.model, ids)
    with torch.inference_mode():
        return {name: next_token_kl(loaded.model, refs, ids_list)
                for name, loaded in built.items()}


# Ops that multiply by a weight matrix, per format: float32/16-bit (mm, addmm), torch.ao
# int8 (quantized::linear_dynamic) and weight-only int8 (the packed kernel).
WEIGHT_MATMULS = ('aten::mm', 'aten::addmm', 'quantized::linear_dynamic',
                  'aten::_weight_int8pack_mm')


def matmul_split(loaded, kv: int = 64, steps: int = 8) -> tuple:
    """Return (weight-matmul s, everything else s) per decode step at KV ``kv``.

    torch.profiler's self CPU time of the ops in ``WEIGHT_MATMULS`` against that of
    all other ops (norms, attention, rotary, cache, Python-side dispatch): a weight
    format speeds up only the first part, so ``step / other`` bounds what any format
    can gain over this one.
    """
    import torch
    from torch.profiler import profile, ProfilerActivity
    from transformers import DynamicCache
    with torch.inference_mode():
        cache = DynamicCache()
        ids = torch.arange(kv, device=loaded.device)[None] % 1000 + 7
        loaded.model(input_ids=ids, past_key_values=cache, use_cache=True)
        token = torch.tensor([[100]], device=loaded.device)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for j in range(steps):
                out = loaded.model(input_ids=token, past_key_values=cache, use_cache=True,
                                   position_ids=torch.tensor([[kv + j]], device=loaded.device))
                token = out.logits[:, -1:].argmax(-1)
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    matmul = sum(e.self_cpu_time_total for e in events if e.key in WEIGHT_MATMULS)
    return matmul / steps / 1e6, (total - matmul) / steps / 1e6


def weight_mib(model) -> float:
    """Return the MiB of a model's parameters and buffers (packed int8 weights included)."""
    import io
    import torch
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    return buffer.tell() / 2 ** 20


def ceiling(row: dict) -> float:
    """Return the most a format could speed up ``row``'s step: its step over its other ops."""
    return (row['matmul_ms'] + row['other_ms']) / row['other_ms'] if row['other_ms'] > 0 \
        else float('inf')


def main(argv=None) -> int:
    """Time every format and write the table."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--kv', type=int, nargs='+', default=[64, 512])
    parser.add_argument('--prefill', type=int, default=256)
    parser.add_argument('--threads', type=int, default=0, help='intra-op threads (0: default)')
    parser.add_argument('--device', default='cpu', help='cpu | cuda')
    parser.add_argument('--kl-prompts', type=int, default=8,
                        help='robot train items for the KL column (0: no KL)')
    parser.add_argument('--out', default=None,
                        help='file stem (default: results/weight_formats-<UTC time>/...)')
    args = parser.parse_args(argv)
    import torch
    from benchmarks.common import machine
    from benchmarks.bench_threads import prefill_s
    from timebill_ros.runtime.model import intra_op_threads, load_model
    from timebill_ros.runtime.profiler import time_decode_steps
    full = load_model('embedded', args.device)
    built = formats(full)
    samples = {name: {'decode': {n: [] for n in args.kv}, 'prefill': [], 'split': []}
               for name in built}
    with intra_op_threads(args.threads):
        for round_ in range(args.rounds):
            for name, loaded in built.items():
                steps = time_decode_steps(loaded, args.kv, 8, 1)
                for n in args.kv:
                    samples[name]['decode'][n].append(steps[n][0])
                samples[name]['prefill'].append(prefill_s(loaded, args.prefill, 0, 1))
                if full.device == 'cpu':  # on CUDA the profiler's CPU times are launches
                    samples[name]['split'].append(matmul_split(loaded, args.kv[0]))
            print(f'round {round_ + 1}/{args.rounds} done', flush=True)
        threads = torch.get_num_threads()
    split = {name: tuple(statistics.median(part) for part in zip(*s['split']))
             for name, s in samples.items() if s['split']}
    kl = divergences(built, args.kl_prompts)
    rows = {name: {'decode_ms': {n: statistics.median(s['decode'][n]) * 1e3 for n in args.kv},
                   'prefill_ms': statistics.median(s['prefill']) * 1e3,
                   'weights_mib': weight_mib(built[name].model), 'kl': kl.get(name),
                   **({'matmul_ms': split[name][0] * 1e3, 'other_ms': split[name][1] * 1e3}
                      if name in split else {})}
            for name, s in samples.items()}
    base = rows['float32']
    lines = [f'# Weight formats on this machine ({datetime.date.today().isoformat()})', '',
             f'`python -m benchmarks.bench_weight_formats '
             f'{" ".join(argv if argv is not None else sys.argv[1:])}` on '
             f'{machine()}, device {args.device}, {threads} intra-op threads, '
             f'embedded model; medians of {args.rounds} interleaved rounds.', '',
             '| format | ' + ' | '.join(f'decode step at KV {n} (ms)' for n in args.kv)
             + f' | prefill {args.prefill} tokens (ms) | weights (MiB) | KL vs float32 | '
             f'weight matmuls / other ops per step at KV {args.kv[0]} (ms) |',
             '|---|' + '---|' * (len(args.kv) + 4)]
    for name, row in rows.items():
        cells = [f"{row['decode_ms'][n]:.1f} ({base['decode_ms'][n] / row['decode_ms'][n]:.2f}x)"
                 for n in args.kv]
        cells.append(f"{row['prefill_ms']:.0f} ({base['prefill_ms'] / row['prefill_ms']:.2f}x)")
        cells.append(f"{row['weights_mib']:.0f}")
        cells.append('-' if row['kl'] is None else f"{row['kl']:.4f}")
        cells.append(f"{row['matmul_ms']:.1f} / {row['other_ms']:.1f}" if 'matmul_ms' in row
                     else '-')
        lines.append(f'| {name} | ' + ' | '.join(cells) + ' |')
    lines += ['', '(x: speed relative to float32; above 1 is faster.)', '']
    if 'matmul_ms' in base:
        lines += ['Weight matmuls / other ops: torch.profiler self CPU time per decode step '
                  '(8 steps per round, medians over the rounds). '
                  'A weight format speeds up only the matmuls: even matmuls that took no time '
                  f"would make float32's step at most {ceiling(base):.1f}x faster.", '']
    out = harness.claim_file(args.out, 'weight_formats')
    out.with_suffix('.md').write_text('\n'.join(lines), encoding='utf-8')
    out.with_suffix('.json').write_text(json.dumps(
        {'date': datetime.date.today().isoformat(), 'threads': threads, 'rows': rows,
         'args': vars(args)}, indent=1, default=str) + '\n', encoding='utf-8')
    print('\n'.join(lines))
    return 0


if __name__ == '__main__':
    sys.exit(main())
