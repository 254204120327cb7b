# SPDX-License-Identifier: Apache-2.0
"""Calibrate the execution-time estimator on the actual model, device and dtype."""

from __future__ import annotations

from dataclasses import dataclass
import platform
import statistics
import time
from typing import Callable, Sequence

from timebill_ros.core.profile import Profile
from timebill_ros.core.timing import (
    ape, fewest_threads, fit_batch, fit_decode, fit_prefill, mape, TimingModel)
from timebill_ros.runtime.model import intra_op_threads, LoadedModel, machine_of, synchronize
from timebill_ros.runtime.prefill import chunk_bounds


@dataclass(frozen=True)
class Grid:
    """Lengths to measure: fit points and held-out points never used by the fit."""

    prefill_fit: tuple = (32, 256, 512, 1024, 1536, 2048, 3072, 4096)
    prefill_heldout: tuple = (128, 768, 1280, 2560, 3584)
    decode_fit: tuple = (16, 512, 1024, 2048, 3072, 4096)
    decode_heldout: tuple = (256, 768, 1536, 2560, 3584)
    repeats: int = 5
    decode_steps: int = 8
    warmup: int = 1


QUICK = Grid(prefill_fit=(32, 256, 768, 1536, 2048), prefill_heldout=(512, 1024),
             decode_fit=(16, 768, 1536, 2048), decode_heldout=(512, 1024), repeats=2,
             decode_steps=6)


def _ids(loaded: LoadedModel, n: int, seed: int):
    import torch
    gen = torch.Generator().manual_seed(seed)
    # Ordinary ids from the middle of the vocabulary (special tokens sit at the ends):
    # timing depends on the length, not on the text.
    vocab = int(loaded.model.config.vocab_size)
    return torch.randint(vocab // 10, vocab * 9 // 10, (1, n), generator=gen).to(loaded.device)


def never() -> bool:
    """Return False: a calibration nothing interrupts."""
    return False


def timed_prefill(loaded: LoadedModel, ids, chunk: int = 0,
                  stop: Callable[[], bool] = never) -> float | None:
    """Return the seconds of one prefill of ``ids`` as the engine runs it, or None if stopped.

    In ``chunk``-token passes (0: one), the last position's logits only; ``stop()`` is
    asked before each pass (a goal arrived: the measurement is dropped).
    """
    import torch
    from transformers import DynamicCache
    with torch.inference_mode():
        t0 = time.monotonic()
        cache = DynamicCache()
        for begin, end in chunk_bounds(ids.shape[1], chunk):
            if stop():
                return None
            out = loaded.model(input_ids=ids[:, begin:end], past_key_values=cache,
                               use_cache=True, logits_to_keep=1)
        int(out.logits[0, -1].argmax())
        return time.monotonic() - t0


def prefill_steps(loaded: LoadedModel, lengths: Sequence[int], repeats: int,
                  warmup: int = 1, chunk: int = 0, stop: Callable[[], bool] = never):
    """Yield after each timed prefill; return {n: median prefill seconds}.

    The lengths are visited round-robin: interleaving the repeats spreads slow drifts of
    the machine (thermal state, neighbours) over all lengths instead of biasing
    whichever length ran then. A prefill ``stop`` cut short is timed again on resuming.
    """
    ids = {n: _ids(loaded, n, n) for n in lengths}
    times: dict = {n: [] for n in lengths}
    for r in range(warmup + repeats):
        for n in lengths:
            seconds = timed_prefill(loaded, ids[n], chunk, stop)
            while seconds is None:
                yield
                seconds = timed_prefill(loaded, ids[n], chunk, stop)
            if r >= warmup:
                times[n].append(seconds)
            yield
    return {n: statistics.median(ts) for n, ts in times.items()}


def decode_steps(loaded: LoadedModel, lengths: Sequence[int], steps: int, repeats: int,
                 threads: int = 0, stop: Callable[[], bool] = never):
    """Yield after each timed run of ``steps`` decode steps; return {n: (median s, mean KV)}.

    One prefill of the longest length fills a cache that each length crops (a stopped
    prefill is redone on resuming); ``stop()`` is asked before each step, and a run it
    cuts short is timed again.
    """
    import torch
    from transformers import DynamicCache
    longest = max(lengths)
    with torch.inference_mode():
        ids = _ids(loaded, longest, 7)
        while True:
            cache = DynamicCache()
            for begin, end in chunk_bounds(longest, 512):
                if stop():
                    break
                loaded.model(input_ids=ids[:, begin:end], past_key_values=cache,
                             use_cache=True, logits_to_keep=1)
            else:
                break
            yield
    result = {}
    for n in sorted(lengths, reverse=True):
        samples: list = []
        while len(samples) < steps * repeats:
            run = _decode_run(loaded, cache, n, steps, threads, stop)
            samples += run or []
            yield
        # The steps grow the cache from n to n + steps - 1: credit the median to the
        # middle length.
        result[n] = (statistics.median(samples), n + (steps - 1) / 2.0)
    return result


def _decode_run(loaded: LoadedModel, cache, n: int, steps: int, threads: int,
                stop: Callable[[], bool]) -> list | None:
    """Return the seconds of ``steps`` decode steps from KV length ``n`` (None: stopped)."""
    import torch
    samples = []
    with torch.inference_mode(), intra_op_threads(threads):
        cache.crop(n)
        token = torch.tensor([[100]], device=loaded.device)
        for j in range(steps):
            if stop():
                return None
            pos = torch.tensor([[n + j]], device=loaded.device)
            t0 = time.monotonic()
            out = loaded.model(input_ids=token, past_key_values=cache, position_ids=pos,
                               use_cache=True)
            int(out.logits[0, -1].argmax())
            samples.append(time.monotonic() - t0)
    return samples


def probe_command(loaded: LoadedModel, threads: int = 0, prompt: int = 64,
                  steps: int = 8) -> tuple:
    """Return (prefill s, median decode step s) of a short command: how fast this copy is.

    A start-up ranking of the resident options (which to profile first), not a profile.
    """
    prefill = timed_prefill(loaded, _ids(loaded, prompt, 3))  # warm
    prefill = min(prefill, timed_prefill(loaded, _ids(loaded, prompt, 3)))
    return prefill, finish(decode_steps(loaded, (prompt,), steps, 1, threads))[prompt][0]


def time_decode_steps(loaded: LoadedModel, lengths: Sequence[int], steps: int,
                      repeats: int) -> dict:
    """Return {n: (median step seconds, mean KV length)} for decode steps starting at n.

    One long prefill fills the cache; cropping it to each length avoids a
    prefill per grid point. KV length means the cache length before the step.
    """
    return finish(decode_steps(loaded, lengths, steps, repeats))


def time_batch_steps(loaded: LoadedModel, max_batch: int, kv_lengths: Sequence[int] = (64, 640),
                     steps: int = 6, repeats: int = 2) -> list:
    """Return [(batch size, total KV, median step s)] for 1..max_batch sequences.

    Each sequence is a prefilled cache of n tokens (one prefill per n, copied per
    member); the batch steps through ``runtime.batch.BatchDecoder`` as the server runs
    it. Total KV is the padded cache over the batch: b x (n + steps / 2).
    """
    import torch
    from transformers import DynamicCache
    from timebill_ros.runtime.batch import BatchDecoder
    points = []
    with torch.inference_mode():
        for n in kv_lengths:
            cache = DynamicCache()
            out = loaded.model(input_ids=_ids(loaded, n, 11 + n), past_key_values=cache,
                               use_cache=True)
            first = int(out.logits[0, -1].argmax())
            layers = [(layer.keys, layer.values) for layer in cache.layers]
            for size in range(1, max_batch + 1):
                samples = []
                for _ in range(repeats):
                    batch = BatchDecoder(loaded.model, loaded.device)
                    for i in range(size):
                        copy = DynamicCache(ddp_cache_data=[(k.clone(), v.clone())
                                                            for k, v in layers])
                        batch.join(f's{i}', copy, n)
                    feed = dict.fromkeys(batch.keys, first)
                    batch.step(feed)  # warm: the first step of a new shape pays allocation
                    for _ in range(steps):
                        t0 = time.monotonic()
                        batch.step(feed)
                        samples.append(time.monotonic() - t0)
                points.append((size, size * (n + 1 + steps / 2.0), statistics.median(samples)))
    return points


def fastest_threads(loaded: LoadedModel, candidates: Sequence[int] | None = None,
                    steps: int = 12, margin: float = 0.05, keep: int | None = None) -> tuple:
    """Time decode steps per intra-op thread count on this thread; return (best, {n: s}).

    Which count wins depends on the CPU and the precision (on the AMD VM int8 steps ran
    19 ms on one thread and 30 ms on two; on the Intel VM 39 ms and 24 ms), hence a
    probe instead of a constant. It runs on the calling thread, which already has an
    OpenMP team: a probe on a new thread beside it would run with two teams, where
    libgomp hardly spins and every multi-threaded op pays a wake-up (the serving worker
    later has the only team; see ``runtime.model.on_own_thread``). The choice is
    ``core.timing.fewest_threads`` (``keep``: the count a stored profile was timed at).
    """
    import torch
    from transformers import DynamicCache
    default = torch.get_num_threads()
    counts = sorted(set(candidates or (1, default)))
    times: dict = {}
    with torch.inference_mode():
        cache = DynamicCache()
        out = loaded.model(input_ids=_ids(loaded, 32, 5), past_key_values=cache, use_cache=True)
        token = out.logits[:, -1:].argmax(-1)
        for n in counts:
            samples = []
            with intra_op_threads(n):
                for j in range(steps + 2):
                    t0 = time.monotonic()
                    out = loaded.model(input_ids=token, past_key_values=cache, use_cache=True)
                    token = out.logits[:, -1:].argmax(-1)
                    synchronize(loaded.device)
                    if j >= 2:  # the first steps at a new count pay thread start-up
                        samples.append(time.monotonic() - t0)
            cache.crop(32)
            times[n] = statistics.median(samples)
    return fewest_threads(times, margin, keep), times


def batch_profile(loaded: LoadedModel, max_batch: int, decode_threads: int = 0) -> tuple:
    """Measure and fit the batched-step model; return (points, BatchTimingModel)."""
    with intra_op_threads(decode_threads):
        points = time_batch_steps(loaded, max_batch)
    return points, fit_batch(points)


def finish(steps):
    """Run a calibration generator to its end; return what it returns."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


def calibrate(loaded: LoadedModel, grid: Grid = Grid(), progress: bool = True,
              decode_threads: int = 0, max_batch: int = 1, prefill_chunk: int = 0) -> Profile:
    """Measure, fit, evaluate on held-out lengths and return the profile.

    ``decode_threads`` > 0 times decode steps with that many intra-op threads, as the
    engine runs them. ``max_batch`` > 1 also profiles batched steps of 1..max_batch
    sequences (``time_batch_steps``). ``prefill_chunk``: the engine's prefill chunk.
    """
    from tqdm import tqdm
    points = len(grid.prefill_fit) + len(grid.prefill_heldout)
    bar = tqdm(total=points * (grid.warmup + grid.repeats), desc='calibrating',
               unit='point', disable=not progress)
    steps = calibration_steps(loaded, grid, decode_threads, max_batch, prefill_chunk)
    while True:
        try:
            next(steps)
            bar.update(1)
        except StopIteration as done:
            bar.close()
            return done.value


def calibration_steps(loaded: LoadedModel, grid: Grid = Grid(), decode_threads: int = 0,
                      max_batch: int = 1, prefill_chunk: int = 0,
                      stop: Callable[[], bool] = never, layer_times: bool = True):
    """Yield after each measured point; return the fitted profile (``calibrate``'s steps).

    Between two points the caller may run goals (the node profiles its options while
    idle): ``stop()``, asked between prefill chunks and decode steps, cuts a point short
    and it is measured again when resumed. ``layer_times``: also time each layer
    (early exit), one point that ``stop`` does not cut.
    """
    import torch
    import transformers
    prefill = yield from prefill_steps(
        loaded, (*grid.prefill_fit, *grid.prefill_heldout), grid.repeats, grid.warmup,
        prefill_chunk, stop)
    decode = yield from decode_steps(loaded, (*grid.decode_fit, *grid.decode_heldout),
                                     grid.decode_steps, grid.repeats, decode_threads, stop)
    times = {}
    if layer_times and hasattr(loaded.model, 'model') and \
            hasattr(loaded.model.model, 'layers'):
        from timebill_ros.runtime.early_exit import measure_layer_times
        with intra_op_threads(decode_threads):
            measured = measure_layer_times(loaded, n_kv=512, steps=grid.decode_steps)
        times = {'layers_s': [float(t) for t in measured.layers],
                 'head_s': float(measured.head_s), 'n_kv': 512}
        yield
    batch_points, batch_fit = [], None
    if max_batch > 1:
        batch_points, batch_fit = batch_profile(loaded, max_batch, decode_threads)
        yield
    return fitted_profile(
        prefill, decode, grid, model=loaded.name, device=loaded.device, dtype=loaded.dtype,
        versions={'torch': str(torch.__version__), 'transformers': transformers.__version__,
                  'python': platform.python_version(),
                  'threads': torch.get_num_threads(),
                  'decode_threads': decode_threads or torch.get_num_threads(),
                  'prefill_chunk': prefill_chunk, 'machine': machine_of(loaded.device)},
        layer_times=times,
        batch_points=[[int(b), float(k), float(t)] for b, k, t in batch_points],
        batch_coefficients=batch_fit.as_list() if batch_fit else [])


def fitted_profile(prefill: dict, decode: dict, grid: Grid, **fields) -> Profile:
    """Fit the ETE to measured times and return the profile with its held-out errors.

    ``prefill``: {prompt length: s}; ``decode``: {start length: (step s, mean KV)};
    ``fields``: the rest of the Profile (model, device, dtype, versions, ...).
    """
    # Weights 1/t^2 minimise relative error, the quantity MAPE and deadlines care about.
    fit_t = [prefill[n] for n in grid.prefill_fit]
    a, b, c = fit_prefill(list(grid.prefill_fit), fit_t, weights=[1 / t ** 2 for t in fit_t])
    fit_pts = [(decode[n][1], decode[n][0]) for n in grid.decode_fit]
    p, q = fit_decode([x for x, _ in fit_pts], [t for _, t in fit_pts],
                      weights=[1 / t ** 2 for _, t in fit_pts])
    model = TimingModel(a, b, c, p, q)
    held_pre = [(n, prefill[n], model.prefill(n)) for n in grid.prefill_heldout]
    held_dec = [(decode[n][1], decode[n][0], model.step(decode[n][1]))
                for n in grid.decode_heldout]

    def residual(points):
        return max(abs(pred - t) / t * 100.0 for _, t, pred in points)
    fit_pre = [(n, prefill[n], model.prefill(n)) for n in grid.prefill_fit]
    fit_dec = [(x, t, model.step(x)) for x, t in fit_pts]
    return Profile(
        coefficients={'a': a, 'b': b, 'c': c, 'p': p, 'q': q},
        prefill_points=[[int(n), float(t)] for n, t in prefill.items()],
        decode_points=[[float(x), float(t)] for t, x in decode.values()],
        heldout={
            'prefill_lengths': list(grid.prefill_heldout),
            'prefill_ape_pct': ape([h[2] for h in held_pre], [h[1] for h in held_pre]),
            'prefill_mape_pct': mape([h[2] for h in held_pre], [h[1] for h in held_pre]),
            'decode_lengths': list(grid.decode_heldout),
            'decode_ape_pct': ape([h[2] for h in held_dec], [h[1] for h in held_dec]),
            'decode_mape_pct': mape([h[2] for h in held_dec], [h[1] for h in held_dec]),
        },
        residuals={'prefill_max_fit_ape_pct': residual(fit_pre),
                   'decode_max_fit_ape_pct': residual(fit_dec)},
        date=time.strftime('%Y-%m-%dT%H:%M:%S%z'), host=platform.node(), **fields)
