# SPDX-License-Identifier: Apache-2.0
"""llama.cpp as a resident engine: GGUF variants of the model behind the backend interface.

The node's own model is the embedded GGUF dequantised for torch; llama.cpp runs the
GGUF itself, and variants at other weight formats are made from it by llama.cpp's
own quantizer (``llama_model_quantize``; from the Q4_1 file, so F16 holds the very
weights the torch path runs in float32). Each variant is one engine option the
planner may run a whole goal on (``core.cut_kinds.OtherEngine``): its prompt is
prefilled in chunks of ``chunk`` tokens with ``interrupt`` asked between them, and
its answer decodes in a lane whose sequences share one llama.cpp context
(``n_seq_max`` sequences, each with its own KV stream, one batch per step).
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, replace
import ctypes
from pathlib import Path
import threading
import time
from typing import Callable, Sequence

from timebill_ros.core.config import LLAMA_FORMATS
from timebill_ros.core.execution import GenerationStats, PrefillInterrupted
from timebill_ros.core.timing import held_prefix, LLAMA_MIN_REUSE
from timebill_ros.runtime.batch import KeyedLane, LaneStep
from timebill_ros.runtime.engine import StreamDecoder
from timebill_ros.runtime.prefill import finish_prefill

# Engine options are named after the engine and the GGUF weight format.
PREFIX = 'llama.cpp-'
# How the KV cache is laid out (profiles timed with another layout are retaken).
KV_LAYOUT = 'stream-per-sequence'
# Fewest shared prompt tokens worth reusing from a held prompt.
MIN_REUSE = LLAMA_MIN_REUSE
# Weight formats a variant may be made at (llama.cpp's file types).
FORMATS = {name: f'LLAMA_FTYPE_MOSTLY_{name.upper()}' for name in LLAMA_FORMATS}
_quiet_lock = threading.Lock()
_quieted: list = []  # the log callback must outlive every model


class LlamaUnavailable(RuntimeError):
    """llama.cpp or a GGUF of the model is not available; the message says why."""


def option_name(weight_format: str) -> str:
    """Return the engine option of a GGUF weight format (e.g. 'llama.cpp-q8_0')."""
    return PREFIX + weight_format


def _llama():
    try:
        import llama_cpp
    except ImportError as exc:  # an optional engine: say how to get it
        raise LlamaUnavailable('llama-cpp-python is not installed (pip install '
                               'llama-cpp-python==0.3.36; it builds llama.cpp, ~6 min on '
                               f'2 cores): {exc}') from exc
    with _quiet_lock:
        if not _quieted:  # llama.cpp logs every tensor on load: keep the node's log readable
            @llama_cpp.llama_log_callback
            def quiet(level, text, user):
                pass
            _quieted.append(quiet)
            llama_cpp.llama_log_set(quiet, ctypes.c_void_p())
            llama_cpp.llama_backend_init()
    return llama_cpp


def model_params(llama_cpp):
    """Return llama.cpp's default model parameters, its AMX weight layout left out.

    A build made with -march=native on a CPU with AMX (Intel Sapphire Rapids) lays Q4_1
    and Q8_0 weights out for AMX tiles, and its kernels die with SIGILL at the first
    tile instruction: on a 2-core Xeon VM, 2026-12-06, the node's first Q4_1 goal
    stopped in ``tilezero`` (ggml-org/llama.cpp PR 26954: the tile configuration is
    lost). Where the library says it has AMX, its extra weight layouts (AMX and
    repack) are off, and the AVX-512 kernels run; elsewhere nothing changes.
    """
    params = llama_cpp.llama_model_default_params()
    if b'AMX_INT8 = 1' in llama_cpp.llama_print_system_info():
        params.use_extra_bufts = False
    return params


def gguf_variant(source: Path, weight_format: str, root: Path) -> Path:
    """Return a GGUF of ``source`` at ``weight_format``, made once by llama.cpp's quantizer.

    ``source`` itself when it already has that format (its name ends in it).
    """
    if weight_format not in FORMATS:
        raise LlamaUnavailable(f'unknown GGUF format {weight_format!r} (expected one of '
                               f'{", ".join(FORMATS)})')
    stem = source.name[:-len('.gguf')]
    base = stem.rsplit('.', 1)[0]
    if stem.lower().endswith('.' + weight_format):
        return source
    target = root / 'gguf' / f'{base}.{weight_format.upper()}.gguf'
    if target.exists():
        return target
    llama_cpp = _llama()
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + '.partial')
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, FORMATS[weight_format])
    params.allow_requantize = True  # from the shipped Q4_1 file
    rc = llama_cpp.llama_model_quantize(str(source).encode(), str(partial).encode(),
                                        ctypes.byref(params))
    if rc != 0:
        partial.unlink(missing_ok=True)
        raise LlamaUnavailable(f'llama_model_quantize {source} -> {weight_format} failed ({rc})')
    partial.rename(target)
    return target


@dataclass
class LlamaSequence:
    """A prefilled sequence of one llama.cpp context (the lane's 'cache')."""

    seq_id: int


@dataclass(frozen=True)
class _Held:
    """A prompt held for the goals after it: its token ids and its KV as sequence state."""

    ids: list
    state: object


class LlamaModel:
    """One GGUF loaded in llama.cpp with one context of ``sequences`` sequences.

    Each sequence has its own KV stream of ``context`` cells (llama.cpp's non-unified
    cache): in one shared buffer, cells of other sequences shift where a sequence's
    attention sums, and greedy answers changed with what else the cache held
    (results/engines/llama_cache_determinism). With ``hold_mb`` > 0 long prompts' KV is
    kept (``llama_state_seq_get_data``, about 23 kB a token), least recently used out
    first past ``hold_mb``, and a prompt that starts the same way as one of them (the
    same context, a new question) restores the one it shares most with and prefills only
    from the last whole chunk the two share, in the chunks a fresh prefill would run:
    tokens with a held prompt equal tokens without it. More than one is kept: a robot
    alternates contexts, and a goal whose context the planner reduced holds the reduced
    prompt, which the next goal with the whole context shares only in part.
    """

    def __init__(self, path: Path, context: int, sequences: int, chunk: int, threads: int,
                 hold_mb: int = 0):
        """Load ``path``; ``context`` KV cells for each of the ``sequences``."""
        llama_cpp = self._api = _llama()
        self.path, self.chunk = Path(path), chunk
        self.hold_bytes = max(0, hold_mb) * 2 ** 20
        self._model = llama_cpp.llama_model_load_from_file(
            str(path).encode(), model_params(llama_cpp))
        if not self._model:
            raise LlamaUnavailable(f'llama.cpp could not load {path}')
        params = llama_cpp.llama_context_default_params()
        self._held: list = []  # _Held prompts, the most recently used last
        params.n_ctx, params.n_seq_max, params.kv_unified = context * sequences, sequences, False
        params.n_batch = params.n_ubatch = chunk
        params.n_threads = params.n_threads_batch = threads
        self._ctx = llama_cpp.llama_init_from_model(self._model, params)
        if not self._ctx:
            llama_cpp.llama_model_free(self._model)
            raise LlamaUnavailable(f'llama.cpp could not make a context for {path}')
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(self._model))
        self.context = llama_cpp.llama_n_ctx_seq(self._ctx)
        self._memory = llama_cpp.llama_get_memory(self._ctx)
        self._batch = llama_cpp.llama_batch_init(max(chunk, sequences), 0, 1)
        self._free = list(range(sequences))
        self._lock = threading.Lock()  # the loop, warm-up and calibration share the context

    def acquire(self) -> int:
        """Return a free sequence id (RuntimeError when every one is in use)."""
        with self._lock:
            if not self._free:
                raise RuntimeError(f'all {self._api.llama_n_seq_max(self._ctx)} llama.cpp '
                                   'sequences are in use')
            return self._free.pop(0)

    def release(self, seq_id: int) -> None:
        """Drop a sequence's KV cells and free its id."""
        with self._lock:
            self._api.llama_memory_seq_rm(self._memory, seq_id, -1, -1)
            if seq_id not in self._free:
                self._free.append(seq_id)

    def shared_prefix(self, ids: Sequence[int], limit: int) -> int:
        """Count the held prompt's first tokens a prefill of ``ids`` would take over.

        Whole chunks only (the rest then runs in a fresh prefill's chunks), at most
        ``limit`` tokens, and none below ``MIN_REUSE``.
        """
        with self._lock:
            return self._best_locked(ids, limit)[0]

    def _best_locked(self, ids: Sequence[int], limit: int) -> tuple:
        """Return (tokens, _Held) of the held prompt sharing the most whole chunks."""
        best = (0, None)
        for held in self._held:
            same = 0
            for mine, theirs in zip(held.ids[:max(0, limit)], ids):
                if mine != theirs:
                    break
                same += 1
            same -= same % self.chunk
            if same >= MIN_REUSE and same > best[0]:
                best = (same, held)
        return best

    @property
    def held_prompts(self) -> list:
        """Return the token ids of the prompts held, the most recently used last."""
        with self._lock:
            return [list(held.ids) for held in self._held]

    @property
    def held_bytes(self) -> int:
        """Return the memory the held prompts' states take."""
        with self._lock:
            return sum(len(held.state) for held in self._held)

    def reuse(self, seq_id: int, ids: Sequence[int], limit: int) -> int:
        """Restore the held KV a prompt's first tokens have in common with ``ids``.

        Into the empty sequence ``seq_id``; as much as ``shared_prefix`` says; return how
        many tokens (0 when llama.cpp cannot restore the state: the prefill runs whole).
        """
        with self._lock:
            same, held = self._best_locked(ids, limit)
            if not same:
                return 0
            state = held.state
            if self._api.llama_state_seq_set_data(self._ctx, state, len(state), seq_id) == 0:
                self._api.llama_memory_seq_rm(self._memory, seq_id, -1, -1)
                return 0
            self._api.llama_memory_seq_rm(self._memory, seq_id, same, -1)
            self._held.remove(held)
            self._held.append(held)
            return same

    def hold(self, seq_id: int, ids: Sequence[int]) -> None:
        """Keep a just prefilled prompt's KV for the next ones (a copy, ~23 kB a token).

        Only prompts a repeat could take whole chunks from (core.timing.held_prefix, the
        rule the evaluator times by). A held prompt the new one starts with is
        replaced by it; the least recently used go first while the held states pass
        ``hold_mb``.
        """
        if not self.hold_bytes or not held_prefix(len(ids), self.chunk):
            return
        state = self.export(seq_id)
        if state is None or len(state) > self.hold_bytes:
            return
        ids = list(ids)
        with self._lock:
            self._held = [held for held in self._held if held.ids != ids[:len(held.ids)]]
            self._held.append(_Held(ids, state))
            while sum(len(held.state) for held in self._held) > self.hold_bytes:
                self._held.pop(0)

    def export(self, seq_id: int):
        """Return a sequence's KV as llama.cpp sequence state (None when it cannot)."""
        api = self._api
        with self._lock:
            size = api.llama_state_seq_get_size(self._ctx, seq_id)
            state = (ctypes.c_uint8 * size)()
            if api.llama_state_seq_get_data(self._ctx, state, size, seq_id) != size:
                return None
            return state

    def adopt(self, state) -> int | None:
        """Load another context's sequence state into a free sequence; return its id.

        The state must come from a model of the same layout and KV type (the GGUF
        variants of one model) and a context of as many sequences (each its own KV
        stream): llama.cpp checks both. None when it cannot be read, or when every
        sequence is in use.
        """
        try:
            seq_id = self.acquire()
        except RuntimeError:
            return None
        with self._lock:
            if self._api.llama_state_seq_set_data(self._ctx, state, len(state), seq_id) != 0:
                return seq_id
        self.release(seq_id)
        return None

    def forget(self) -> None:
        """Drop the held prompts (calibration times whole prefills)."""
        with self._lock:
            self._held = []

    def crop(self, seq_id: int, length: int) -> None:
        """Keep only a sequence's first ``length`` KV cells."""
        with self._lock:
            self._api.llama_memory_seq_rm(self._memory, seq_id, length, -1)

    def decode(self, entries: Sequence[tuple]) -> list:
        """Run one llama_decode of (token, position, seq id, wants logits) entries.

        Return the logits rows (numpy, float32) of the entries that want them, in order.
        """
        import numpy as np
        api, batch = self._api, self._batch
        with self._lock:
            batch.n_tokens = len(entries)
            for i, (token, position, seq_id, wants) in enumerate(entries):
                batch.token[i], batch.pos[i] = token, position
                batch.n_seq_id[i], batch.seq_id[i][0], batch.logits[i] = 1, seq_id, wants
            status = api.llama_decode(self._ctx, batch)
            if status != 0:
                raise RuntimeError(f'llama_decode returned {status} (KV cache full: '
                                   f'{self.context} cells a sequence)')
            return [np.ctypeslib.as_array(api.llama_get_logits_ith(self._ctx, i),
                                          shape=(self.n_vocab,)).copy()
                    for i, entry in enumerate(entries) if entry[3]]

    def close(self) -> None:
        """Free the context, batch and model."""
        with self._lock:
            if self._ctx:
                self._api.llama_batch_free(self._batch)
                self._api.llama_free(self._ctx)
                self._api.llama_model_free(self._model)
                self._ctx = None


class LlamaLane(KeyedLane):
    """Sequences of one llama.cpp context stepping together (one batch per step)."""

    exclusive = False

    def __init__(self, model: LlamaModel):
        """Step sequences of ``model``."""
        super().__init__()
        self.model = model

    def cached_tokens(self) -> int:
        """Return the longest sequence's KV length."""
        return max((position for _, position in self._members.values()), default=0)

    def leave(self, key: str) -> None:
        """Remove a sequence and free its KV cells."""
        cache, _ = self._members.pop(key)
        self.model.release(cache.seq_id)

    def discard(self, cache) -> None:
        """Free the KV cells of a sequence that never joined."""
        self.model.release(cache.seq_id)

    def step(self, feed: dict, budgets: dict | None = None) -> dict:
        """Feed each sequence its token in one batch; return key -> LaneStep (logits)."""
        keys = list(feed)
        entries = [(feed[k], self._members[k][1], self._members[k][0].seq_id, True)
                   for k in keys]
        rows = self.model.decode(entries)
        for k in keys:
            self._members[k][1] += 1
        return {k: LaneStep(logits=row) for k, row in zip(keys, rows)}


class LlamaEngine:
    """One GGUF variant as a backend: chunked prefill, batched lanes, greedy picks."""

    capabilities = frozenset({'logits'})

    def __init__(self, model: LlamaModel, option: str, tokenizer, eos_ids,
                 clock: Callable[[], float] = time.monotonic, tokenizer_lock=None):
        """Serve ``option`` on ``model``; ``tokenizer`` (the vocabulary it shares) streams."""
        self.model, self.option, self.clock = model, option, clock
        self.tokenizer, self.tokenizer_lock = tokenizer, tokenizer_lock
        self.eos_ids = frozenset(eos_ids)

    def cached_prefix(self, prompt_ids: Sequence[int]) -> int:
        """Return the prompt tokens a prefill would take from the held prompt now."""
        return self.model.shared_prefix(prompt_ids, len(prompt_ids) - 1)

    def begin_prefill(self, prompt_ids: Sequence[int], plan, decide=None) -> 'LlamaPrefill':
        """Return a prefill of one prompt in the context's chunks (a PrefillRun)."""
        if decide is not None:
            raise ValueError(f'{self.option} cannot plan during prefill (no hidden states)')
        return LlamaPrefill(self, prompt_ids, plan)

    def begin_handover(self, prompt_ids: Sequence[int], plan,
                       target: 'LlamaEngine') -> 'HandOver':
        """Return a prefill here whose sequence then decodes on ``target`` (a PrefillRun)."""
        return HandOver(self.begin_prefill(prompt_ids, plan), target)

    def prefill(self, prompt_ids: Sequence[int], plan, decide=None, interrupt=None) -> tuple:
        """Prefill in chunks, asking ``interrupt()`` between them; return (seq, logits, stats).

        Raise PrefillInterrupted when ``interrupt`` says stop (the sequence is freed).
        """
        return finish_prefill(self.begin_prefill(prompt_ids, plan, decide), interrupt)

    def lane_key(self, plan) -> tuple:
        """Return this option's lane."""
        return (self.option,)

    def lane(self, key: tuple) -> LlamaLane:
        """Return a new lane on this option's context."""
        return LlamaLane(self.model)

    def threads(self, key: tuple):
        """Return no thread setting: llama.cpp runs its own pool (``llama_threads``)."""
        return nullcontext()

    def pick(self, logits) -> int:
        """Return the greedy token of a logits row."""
        return int(logits.argmax())

    def stream(self) -> StreamDecoder:
        """Return a text stream for one answer (the shared vocabulary's tokenizer)."""
        return StreamDecoder(self.tokenizer, self.tokenizer_lock)

    def warm_up(self, tokens: int = 4) -> None:
        """Prefill a few tokens and step a few times (first-call costs off the first goal)."""
        sequence, logits, _ = self.prefill([1, 2, 3, 4, 5, 6, 7, 8], None)
        lane = self.lane((self.option,))
        lane.join('warm-up', sequence, 8)
        token = self.pick(logits)
        for _ in range(tokens - 1):
            token = self.pick(lane.step({'warm-up': token})['warm-up'].logits)
        lane.leave('warm-up')


class LlamaPrefill:
    """A prompt prefilled into one llama.cpp sequence a chunk (``n_batch``) at a time."""

    def __init__(self, engine: LlamaEngine, prompt_ids: Sequence[int], plan):
        """Take a sequence of the engine's context for ``prompt_ids``."""
        self.engine, self.ids = engine, list(prompt_ids)
        self.total, self.logits = len(self.ids), None
        self.seq_id = engine.model.acquire()
        self.stats = GenerationStats(plan=plan)
        self.tokens_done = engine.model.reuse(self.seq_id, self.ids, self.total - 1)
        self.stats.prefix_tokens = self.tokens_done

    @property
    def chunks_left(self) -> int:
        """Count the chunks still to run."""
        return -(-(self.total - self.tokens_done) // self.engine.model.chunk)

    @property
    def next_chunk(self) -> int:
        """Count the prompt tokens the next chunk holds (0 when done)."""
        return min(self.engine.model.chunk, self.total - self.tokens_done)

    @property
    def done(self) -> bool:
        """Tell whether the whole prompt is in the sequence."""
        return self.tokens_done >= self.total

    @property
    def next_chunk_extra_s(self) -> float:
        """Return 0: a chunk here is a plain pass (no press runs on llama.cpp)."""
        return 0.0

    def advance(self) -> None:
        """Decode the next chunk (logits of the prompt's last token only)."""
        begin, model = self.tokens_done, self.engine.model
        part = self.ids[begin:begin + model.chunk]
        last = begin + len(part) == self.total
        t0 = self.engine.clock()
        rows = model.decode([(token, begin + i, self.seq_id, last and i == len(part) - 1)
                             for i, token in enumerate(part)])
        self.tokens_done = begin + len(part)
        if last:  # keeping the prompt is part of its prefill's time (~70 ms at 4k tokens)
            self.logits = rows[-1]
            model.hold(self.seq_id, self.ids)
        self.stats.prefill_s += self.engine.clock() - t0

    def result(self) -> tuple:
        """Return (the sequence, first logits, stats) of the finished prefill."""
        if not self.done:
            raise RuntimeError(f'prefill not finished ({self.tokens_done} of {self.total})')
        self.stats.kv_tokens_after_prefill = self.total
        return LlamaSequence(self.seq_id), self.logits, self.stats

    def abandon(self) -> None:
        """Free the sequence's KV cells."""
        if self.seq_id is not None:
            self.engine.model.release(self.seq_id)
            self.seq_id = None


class HandOver:
    """A prompt prefilled on one llama.cpp option whose answer decodes on another.

    The GGUF variants share the model's layout and an f16 KV cache, so the prompt's KV
    written by the prefill option's context, exported as llama.cpp sequence state, is
    read by the decode option's: the prompt prefills where that is fast (F16) and the
    answer decodes where steps are short (Q4_1). The move is part of the prefill's
    time. Should the decode option refuse the state, the goal decodes where it was
    prefilled, and its plan says so.
    """

    def __init__(self, prefill: LlamaPrefill, target: LlamaEngine):
        """Run ``prefill`` (on its option), then move the sequence to ``target``."""
        self.prefill, self.target = prefill, target

    total = property(lambda self: self.prefill.total)
    tokens_done = property(lambda self: self.prefill.tokens_done)
    chunks_left = property(lambda self: self.prefill.chunks_left)
    next_chunk = property(lambda self: self.prefill.next_chunk)
    done = property(lambda self: self.prefill.done)
    next_chunk_extra_s = property(lambda self: self.prefill.next_chunk_extra_s)

    def advance(self) -> None:
        """Prefill the next chunk on the prefill option."""
        self.prefill.advance()

    def result(self) -> tuple:
        """Return (the sequence on the decode option, first logits, stats)."""
        sequence, logits, stats = self.prefill.result()
        source, clock = self.prefill.engine, self.target.clock
        t0 = clock()
        state = source.model.export(sequence.seq_id)
        moved = self.target.model.adopt(state) if state is not None else None
        if moved is None:  # decode where the prompt is: the plan names that option
            if stats.plan is not None:
                stats.plan = replace(
                    stats.plan, precision=source.option, prefill_precision='',
                    note=f'{stats.plan.note}; {self.target.option} could not read the '
                         f'prompt from {source.option}: decoding there')
            return sequence, logits, stats
        source.model.release(sequence.seq_id)
        self.prefill.seq_id = None
        stats.prefill_s += clock() - t0
        return LlamaSequence(moved), logits, stats

    def abandon(self) -> None:
        """Free the prefill option's sequence."""
        self.prefill.abandon()


def _ids(n: int, seed: int) -> list:
    import numpy as np
    # Ordinary ids from the middle of the vocabulary: timing depends on the length only.
    return np.random.default_rng(seed).integers(5000, 45000, n).tolist()


def _timed_prefill(engine: LlamaEngine, ids: list, stop) -> float | None:
    """Return one chunked prefill's seconds (its sequence freed), or None if stopped."""
    engine.model.forget()
    try:
        sequence, _, stats = engine.prefill(ids, None, interrupt=stop)
    except PrefillInterrupted:
        return None
    engine.model.release(sequence.seq_id)
    return stats.prefill_s


def prefill_steps(engine: LlamaEngine, lengths: Sequence[int], repeats: int,
                  warmup: int = 1, stop=lambda: False):
    """Yield after each timed prefill; return {n: median s of a chunked prefill of n}.

    Lengths round-robin; a prefill ``stop`` cut short is timed again on resuming.
    """
    import statistics
    prompts = {n: _ids(n, n) for n in lengths}
    times: dict = {n: [] for n in lengths}
    for r in range(warmup + repeats):
        for n in lengths:
            seconds = _timed_prefill(engine, prompts[n], stop)
            while seconds is None:
                yield
                seconds = _timed_prefill(engine, prompts[n], stop)
            if r >= warmup:
                times[n].append(seconds)
            yield
    return {n: statistics.median(ts) for n, ts in times.items()}


def decode_steps(engine: LlamaEngine, lengths: Sequence[int], steps: int, repeats: int,
                 stop=lambda: False):
    """Yield after each length; return {n: (median step s, mean KV)} from KV length n.

    Each length prefills its own sequence and frees it before yielding, so no sequence
    is held while goals run between two points.
    """
    import statistics
    result = {}
    for n in sorted(lengths, reverse=True):
        samples = None
        while samples is None:
            samples = _decode_run(engine, n, steps * repeats, stop)
            if samples is None:
                yield
        result[n] = (statistics.median(samples), n + (steps - 1) / 2.0)
        yield
    return result


def _decode_run(engine: LlamaEngine, n: int, steps: int, stop) -> list | None:
    """Return the seconds of ``steps`` decode steps from KV length ``n`` (None: stopped)."""
    try:
        sequence, _, _ = engine.prefill(_ids(n, 7), None, interrupt=stop)
    except PrefillInterrupted:
        return None
    model, seq_id, samples = engine.model, sequence.seq_id, []
    try:
        token = 100
        for j in range(steps):
            if stop():
                return None
            t0 = time.monotonic()
            token = int(model.decode([(token, n + j, seq_id, True)])[0].argmax())
            samples.append(time.monotonic() - t0)
    finally:
        model.release(seq_id)
    return samples


def probe_command(engine: LlamaEngine, prompt: int = 64, steps: int = 8) -> tuple:
    """Return (prefill s, median decode step s) of a short command on this option."""
    import statistics
    ids = _ids(prompt, 3)
    prefill = min(_timed_prefill(engine, ids, lambda: False) for _ in range(2))
    return prefill, statistics.median(_decode_run(engine, prompt, steps, lambda: False))


def llama_grid(quick: bool):
    """Return the calibration grid of an option: llama.cpp's times vary little run to run.

    Quick: one timed pass after the warm-up, prompts up to 1,536 tokens (~15 s an option on
    a 2-core VM); otherwise the torch grid.
    """
    from timebill_ros.runtime.profiler import Grid
    if not quick:
        return Grid()
    return Grid(prefill_fit=(32, 256, 768, 1536), prefill_heldout=(512,),
                decode_fit=(16, 768, 1536), decode_heldout=(512,), repeats=1,
                decode_steps=6, warmup=0)


def calibrate_llama(engine: LlamaEngine, grid, name: str) -> object:
    """Measure one option's chunked prefill and decode steps; return its fitted Profile."""
    from timebill_ros.runtime.profiler import finish
    return finish(llama_calibration_steps(engine, grid, name))


def llama_calibration_steps(engine: LlamaEngine, grid, name: str, stop=lambda: False):
    """Yield after each measured point; return the option's fitted Profile.

    ``stop()`` is asked between prefill chunks and decode steps: a point it cuts short
    is measured again when resumed (the node profiles options between goals).
    """
    import platform
    from timebill_ros.runtime.model import machine_of
    from timebill_ros.runtime.profiler import fitted_profile
    prefill = yield from prefill_steps(engine, (*grid.prefill_fit, *grid.prefill_heldout),
                                       grid.repeats, grid.warmup, stop)
    decode = yield from decode_steps(engine, (*grid.decode_fit, *grid.decode_heldout),
                                     grid.decode_steps, grid.repeats, stop)
    import llama_cpp
    return fitted_profile(prefill, decode, grid, model=name, device='cpu', dtype=engine.option,
                          versions={'llama_cpp': llama_cpp.__version__,
                                    'python': platform.python_version(),
                                    'chunk': engine.model.chunk, 'kv': KV_LAYOUT,
                                    'gguf': engine.model.path.name,
                                    'machine': machine_of('cpu')})
