# SPDX-License-Identifier: Apache-2.0
"""Benchmark: tokens/s and TPOT through the node vs a bare transformers loop; start times.

Run with ``make bench-overhead`` (or ``python -m benchmarks.bench_overhead``). The
bare loop and the node run the same prompts, greedy, taking turns prompt by prompt on
this machine, so both see the same CPU. Decode throughput through the node is taken
from the node's own result (e2e minus queue and prefill, i.e. including the
per-token deadline checks and feedback publishing) and from the client's
feedback arrival times.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks import common, harness
from benchmarks.paths import CONFIG, REPO

PROMPTS = [
    'Explain how a car engine works.',
    'Write a short poem about the sea.',
    'Describe the water cycle in detail.',
    'What are the benefits of regular exercise?',
    'Give advice for a first job interview.',
]


def bare_loop(loaded, ids, max_new: int) -> tuple:
    """Greedy decode with plain transformers calls; return (tokens, prefill_s, decode_s)."""
    import torch
    from transformers import DynamicCache
    model = loaded.model
    with torch.inference_mode():
        cache = DynamicCache()
        t0 = time.monotonic()
        out = model(input_ids=torch.tensor([ids], device=model.device), past_key_values=cache,
                    use_cache=True)
        nxt = int(out.logits[0, -1].argmax())
        t1 = time.monotonic()
        tokens = 0
        for i in range(max_new):
            if nxt in loaded.eos_ids:
                break
            tokens += 1
            if tokens == max_new:
                break
            out = model(input_ids=torch.tensor([[nxt]], device=model.device),
                        past_key_values=cache, use_cache=True,
                        position_ids=torch.tensor([[len(ids) + i]], device=model.device))
            nxt = int(out.logits[0, -1].argmax())
        t2 = time.monotonic()
    return tokens, t1 - t0, t2 - t1


def bare_llama_loop(llm, ids, max_new: int) -> tuple:
    """Greedy decode with llama-cpp-python's own loop; return (tokens, prefill_s, decode_s)."""
    llm.reset()
    times = [time.monotonic()]
    eos = llm.token_eos()
    for token in llm.generate(list(ids), top_k=1, temp=0.0, reset=True):
        times.append(time.monotonic())
        if token == eos or len(times) - 1 >= max_new:
            break
    return len(times) - 1, times[1] - times[0], times[-1] - times[1]


def option_name(weight_format: str) -> str:
    """Return the node's name of a llama.cpp option."""
    from timebill_ros.runtime.llama_engine import option_name as name
    return name(weight_format)


@contextlib.contextmanager
def node_model_params():
    """Make llama-cpp-python's ``Llama`` load a model with the node's model parameters.

    ``Llama`` starts from ``llama_model_default_params()`` and takes no argument for the
    weight layouts; where the library has AMX those layouts crash (SIGILL), so the node
    leaves them out (``llama_engine.model_params``) and the bare loop must do the same
    to run at all, and to run the kernels the node runs.
    """
    from llama_cpp import llama_cpp as lib
    from timebill_ros.runtime.llama_engine import model_params
    params, default = model_params(lib), lib.llama_model_default_params
    lib.llama_model_default_params = lambda: params
    try:
        yield params
    finally:
        lib.llama_model_default_params = default


def llama_loop(weight_format: str):
    """Return a bare-loop function on llama-cpp-python's own Llama for one GGUF format."""
    from llama_cpp import Llama
    from timebill_ros.runtime.llama_engine import gguf_variant
    from timebill_ros.runtime.model import cache_root, embedded_gguf
    with node_model_params():
        llm = Llama(str(gguf_variant(embedded_gguf(), weight_format, cache_root())),
                    n_ctx=2048, n_threads=os.cpu_count(), verbose=False)
    return lambda _loaded, ids, max_new: bare_llama_loop(llm, ids, max_new)


def node_start_time(cache_dir: str | None) -> float:
    """Start the node (optionally on an empty model cache) and time until it is ready."""
    env = dict(os.environ)
    if cache_dir:
        env['TIMEBILL_CACHE'] = cache_dir
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, '-m', 'timebill_ros.ros.node'], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for line in proc.stdout:
            if ']: ready:' in line:
                return time.monotonic() - t0
        raise SystemExit('bench: node exited before it was ready')
    finally:
        proc.terminate()
        proc.wait(10)


def main(argv=None) -> int:
    """Print the benchmark table and write JSON next to it."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument('--max-new-tokens', type=int, default=64)
    parser.add_argument('--repeats', type=int, default=2)
    parser.add_argument('--device', default='cpu', choices=('cpu', 'cuda', 'auto'))
    parser.add_argument('--no-start-times', action='store_true',
                        help='skip the cold and warm node start timings (device checks)')
    parser.add_argument('--engine', default='', help='a llama.cpp GGUF format (e.g. q4_1): '
                        "compare the node's goals pinned to that option with llama-cpp-python's "
                        'own generation loop on the same GGUF')
    parser.add_argument('--feedback-period-s', type=float, default=None,
                        help="the node's feedback_period_s (default: config/timebill.yaml's); "
                        '0: a feedback message per token')
    parser.add_argument('--out', default=None,
                        help='JSON file (default: results/overhead-<UTC time>/...)')
    args = parser.parse_args(argv)

    from timebill_ros.runtime.model import load_model, prompt_ids
    loaded = load_model('embedded', args.device)
    prompts = [prompt_ids(loaded.tokenizer, p) for p in PROMPTS]
    device = loaded.device
    option, decode = (option_name(args.engine), llama_loop(args.engine)) if args.engine \
        else ('', bare_loop)
    decode(loaded, prompts[0], 8)  # warm up like the node does
    bare = {'tokens': 0, 'decode_s': 0.0, 'steps': 0}

    from timebill_ros.cli.demo import start_node
    import rclpy
    from timebill_ros.tools.client import InstructClient, make_goal
    node = start_node(str(CONFIG),
                      ['-p', f'max_new_tokens_limit:={max(1024, args.max_new_tokens)}',
                       '-p', f'device:={args.device}'] + (
                          ['-p', f'feedback_period_s:={args.feedback_period_s}']
                          if args.feedback_period_s is not None else []))
    rclpy.init()
    client = InstructClient(node_name='timebill_bench')
    via = {'tokens': 0, 'decode_s': 0.0, 'steps': 0, 'client_s': 0.0, 'client_steps': 0}
    try:
        client.wait_for_server(30)
        # Bare loop and node take turns per prompt (the node idles during the bare loop),
        # so a drift of this shared VM's speed lands on both sides alike.
        for _ in range(args.repeats):
            for text, ids in zip(PROMPTS, prompts):
                tokens, _, decode_s = decode(loaded, ids, args.max_new_tokens)
                bare['tokens'] += tokens
                bare['steps'] += tokens - 1
                bare['decode_s'] += decode_s
                arrivals = []
                # A pinned option runs MODE_NONE with the cap as its expected length, so
                # no length predictor runs before it.
                goal = make_goal(text, 300.0, max_new_tokens=args.max_new_tokens,
                                 precision=option,
                                 expected_tokens=args.max_new_tokens if option else 0)
                run = client.ask(goal, 600, lambda f: arrivals.append(
                    (time.monotonic(), f.token_index)))
                res = run.result
                via['tokens'] += res.tokens
                via['steps'] += res.tokens - 1
                via['decode_s'] += res.e2e_s - res.queue_s - res.prefill_s
                # Paced feedback carries several tokens a message: count the tokens.
                via['client_s'] += arrivals[-1][0] - arrivals[0][0]
                via['client_steps'] += arrivals[-1][1] - arrivals[0][1]
    finally:
        client.close()
        rclpy.try_shutdown()
        node.terminate()
        node.wait(10)
    del loaded

    cold = warm = float('nan')
    if not args.no_start_times:
        with tempfile.TemporaryDirectory() as empty_cache:
            cold = node_start_time(empty_cache)
        warm = statistics.median(node_start_time(None) for _ in range(2))

    bare_tpot = bare['decode_s'] / bare['steps']
    node_tpot = via['decode_s'] / via['steps']
    client_tpot = via['client_s'] / via['client_steps']
    report = {
        'machine': common.machine(),
        'date': time.strftime('%Y-%m-%d'),
        'model': f'SmolLM2-135M-Instruct (embedded, {option or "float32"}, {device})',
        'bare_loop': "llama-cpp-python's Llama.generate" if option else 'transformers',
        'prompts': len(PROMPTS) * args.repeats, 'max_new_tokens': args.max_new_tokens,
        'bare_tokens': bare['tokens'], 'node_tokens': via['tokens'],
        'bare_tpot_ms': 1000 * bare_tpot, 'node_tpot_ms': 1000 * node_tpot,
        'client_tpot_ms': 1000 * client_tpot,
        'bare_tokens_per_s': 1 / bare_tpot, 'node_tokens_per_s': 1 / node_tpot,
        'overhead_ratio': node_tpot / bare_tpot,
        'client_overhead_ratio': client_tpot / bare_tpot,
        'cold_start_s': cold, 'warm_start_s': warm,
        'feedback_period_s': args.feedback_period_s, 'commit': common.commit(),
    }
    out = harness.claim_file(
        args.out or str(harness.run_dir('overhead') / 'bench_overhead.json'),
        'bench_overhead.json')
    with open(out, 'w', encoding='utf-8') as handle:
        json.dump(report, handle, indent=2)
    print(f"| measure | bare loop | through node |\n|---|---|---|\n"
          f"| decode TPOT (ms) | {report['bare_tpot_ms']:.2f} | {report['node_tpot_ms']:.2f} "
          f"(client-side {report['client_tpot_ms']:.2f}) |\n"
          f"| tokens/s | {report['bare_tokens_per_s']:.1f} | "
          f"{report['node_tokens_per_s']:.1f} |\n"
          f"| overhead ratio | 1.00 | {report['overhead_ratio']:.3f} "
          f"(client-side {report['client_overhead_ratio']:.3f}) |\n\n"
          f"cold start (empty model cache, dequantise GGUF): {cold:.1f} s; "
          f"warm start: {warm:.1f} s\n{report['machine']}, {report['date']}, "
          f"tokens bare/node {bare['tokens']}/{via['tokens']}")
    return 0


if __name__ == '__main__':
    sys.exit(main())
