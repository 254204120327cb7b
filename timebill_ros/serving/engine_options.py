# SPDX-License-Identifier: Apache-2.0
"""Other resident engines as planning options: llama.cpp variants of the model, profiled.

Each option (``llama_engines``: a GGUF weight format) is a LlamaEngine with its own
execution-time profile (calibrated once, then stored beside the main profile like a
resident precision's) and its own online ETE. The planner weighs them against the
torch cuts with the fidelity rows of ``cut_effects``; the node logs how fast each is
here, so the regime the machine is in (which engine wins which goals) is visible.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from timebill_ros.core.cut_kinds import handover_name, handover_pairs, HANDOVER_S_PER_TOKEN
from timebill_ros.core.preemption import loop_seats
from timebill_ros.core.profile import Profile
from timebill_ros.runtime.llama_engine import (
    gguf_variant, KV_LAYOUT, LlamaEngine, LlamaModel,
    LlamaUnavailable, option_name)
from timebill_ros.runtime.model import cache_root, EMBEDDED_NAME, embedded_gguf, machine_of
from timebill_ros.serving import artifacts
from timebill_ros.serving.artifacts import Log


def llama_sequences(max_batch: int) -> int:
    """Return the sequences an option's context holds for a loop of ``max_batch``.

    Every goal the loop holds (core.preemption.loop_seats: decoding, prefilling, paused)
    needs one, or its prefill would fail.
    """
    return loop_seats(max_batch)


def llama_engines(config, loaded, log: Log) -> dict:
    """Return {option: LlamaEngine} for ``config.llama_formats()`` ({} when off or unusable).

    Only the embedded model has a GGUF; any other model, or a missing llama-cpp-python,
    leaves the node on its torch path with a warning.
    """
    formats = config.llama_formats()
    if not formats:
        return {}
    if loaded.name != EMBEDDED_NAME or loaded.device != 'cpu':
        log.warning(f'llama_engines {config.llama_engines!r} ignored: llama.cpp options need '
                    f'the embedded model on cpu (this is {loaded.name} on {loaded.device})')
        return {}
    threads = config.llama_threads or None
    engines = {}
    try:
        for weight_format in formats:
            option = option_name(weight_format)
            path = gguf_variant(embedded_gguf(), weight_format, cache_root())
            model = LlamaModel(path, config.llama_context, llama_sequences(config.max_batch),
                               config.llama_chunk, threads or _cores(),
                               hold_mb=config.prefix_cache_mb)
            engines[option] = LlamaEngine(model, option, loaded.tokenizer, loaded.eos_ids,
                                          tokenizer_lock=loaded.tokenizer_lock)
            if config.warm_up:
                engines[option].warm_up()
    except LlamaUnavailable as exc:
        log.warning(f'llama_engines {config.llama_engines!r} unavailable: {exc}')
        for engine in engines.values():
            engine.model.close()
        return {}
    return engines


def _cores() -> int:
    import os
    return len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count()


def option_profile(log: Log, engine: LlamaEngine, loaded, path: Path,
                   recalibrate: bool) -> Profile | None:
    """Return the option's stored profile (None: none, or timed otherwise and ``recalibrate``).

    A missing one is measured by the node's warm-up (serving/warmup.py).
    """
    made_for = SimpleNamespace(name=loaded.name, device='cpu', dtype=engine.option)
    profile = artifacts.stored_profile(log, path, made_for, 0, False)
    if profile is not None and recalibrate and not _timed_as_run(profile, engine):
        log.info(f'{path} was timed with another llama.cpp chunk or KV layout, or on '
                 'another machine: recalibrating')
        return None
    return profile


def _timed_as_run(profile: Profile, engine: LlamaEngine) -> bool:
    """Tell whether a stored option profile was timed with the option's chunk and KV layout.

    And on this machine, where the profile says (one without the field predates it).
    """
    versions = profile.versions
    return (int(versions.get('chunk', 0)) == engine.model.chunk
            and versions.get('kv') == KV_LAYOUT
            and versions.get('machine', machine_of('cpu')) == machine_of('cpu'))


def describe_regime(main, precisions: dict, engines: dict, prompt: int = 64,
                    answer: int = 32, handover: bool = True) -> str:
    """Return how fast each resident option is here and which one a short command favours.

    ``main``: the torch ETE; ``precisions``: {name: TimingModel} of resident copies (they
    decode after the main model's prefill); ``engines``: {name: TimingModel} of other
    engines (whole goals), and with ``handover`` each pair of them that prefills on one
    and decodes on the other. Times are for a ``prompt``-token command, ``answer`` tokens.
    """
    rows = {'torch': (main.wcet(prompt, 0.0, answer), main.step(prompt))}
    rows.update({name: (main.prefill(prompt) + model.decode(prompt, answer), model.step(prompt))
                 for name, model in precisions.items()})
    rows.update({name: (model.wcet(prompt, 0.0, answer), model.step(prompt))
                 for name, model in engines.items()})
    if handover:  # one option's prefill, another's steps (core.cut_kinds.EngineHandOver)
        rows.update({handover_name(a, b): (
            engines[a].prefill(prompt) + HANDOVER_S_PER_TOKEN * prompt
            + engines[b].decode(prompt, answer), engines[b].step(prompt))
            for a, b in handover_pairs(engines, prompt)})
    fastest = min(rows, key=lambda name: rows[name][0])
    parts = ', '.join(f'{name} {seconds:.2f} s (step {1e3 * step:.1f} ms)'
                      for name, (seconds, step) in rows.items())
    return (f'resident options for a {prompt}-token command with a {answer}-token answer: '
            f'{parts}; fastest here: {fastest}{_prefill_regime(main, engines)}')


def _prefill_regime(main, engines: dict, longest: int = 8192) -> str:
    """Return where the torch prefill overtakes every other engine's ('' without engines)."""
    if not engines:
        return ''
    for n in range(64, longest + 1, 64):
        if all(main.prefill(n) < model.prefill(n) for model in engines.values()):
            return f'; the torch prefill is the fastest from about {n} prompt tokens'
    return f'; another engine prefills faster than torch up to {longest} prompt tokens'
