# SPDX-License-Identifier: Apache-2.0
"""The local torch engine: prefill one prompt, decode lanes of sequences, pick tokens.

The serving loop (serving/loop.py) is the only token loop; it drives this engine
through the engine interface (serving/engine_interface.py): ``prefill`` a prompt under its
plan's press, a ``lane`` per precision (or early exit) that steps its sequences
together, ``pick`` the token from (possibly masked) logits, and the KV operations it
offers listed in ``capabilities``.
"""

from __future__ import annotations

from contextlib import nullcontext
import time
from typing import Callable, Sequence

from timebill_ros.core.execution import FULL_LANE, GenerationStats, PrefillDecision
from timebill_ros.core.planning import MIXED, Plan, SIXTEEN_BIT
from timebill_ros.core.request import Mode
from timebill_ros.runtime.batch import BatchDecoder
from timebill_ros.runtime.early_exit import ExitLane
from timebill_ros.runtime.model import intra_op_threads, LoadedModel, synchronize
from timebill_ros.runtime.prefill import chunk_bounds, finish_prefill

# The lane key of early-exit decoding (precision lanes are keyed by their precision).
EARLY_EXIT_LANE = ('early-exit',)


class StreamDecoder:
    """Turn token ids into text deltas whose concatenation is the decoded text.

    A byte-level BPE token can end inside a UTF-8 character; such text is held
    back until the character is complete, so no delta ever has to be retracted.
    Each push decodes only a window (the tokens since the last emitted delta and
    the ones before it), as vLLM's incremental detokenizer does: decoding the whole
    answer at every token cost about 10 % of a llama.cpp step here.
    """

    def __init__(self, tokenizer, lock=None):
        """Start with no tokens; ``lock`` guards a tokenizer shared across threads."""
        self._tok = tokenizer
        self._lock = lock if lock is not None else nullcontext()
        self._ids: list = []
        self._text = ''
        # ids[prefix:read] decoded last time as context; ids[read:] not emitted yet.
        self._prefix = self._read = 0

    def _decode(self, ids) -> str:
        return self._tok.decode(ids, skip_special_tokens=True,
                                clean_up_tokenization_spaces=False)

    def push(self, token_id: int) -> str:
        """Add a token and return the new text it completes (may be '')."""
        self._ids.append(token_id)
        with self._lock:
            before = self._decode(self._ids[self._prefix:self._read])
            text = self._decode(self._ids[self._prefix:])
        if text.endswith('\ufffd') or len(text) <= len(before) \
                or not text.startswith(before):
            return ''
        delta = text[len(before):]
        self._prefix, self._read = self._read, len(self._ids)
        self._text += delta
        return delta

    @property
    def text(self) -> str:
        """Return the text emitted so far."""
        return self._text


PressFactory = Callable[[Plan, int], object]  # (plan, prompt tokens) -> press or None


class PressCost:
    """What a press adds to a chunked prefill's last chunk, per cached token (learned).

    The last chunk scores and compresses the whole cache (and the prefix cache copies
    its blocks first); Kill must know it to stop before a last chunk that would end past
    the deadline. Shared by the engines made over one model, like the prefix cache.
    """

    def __init__(self):
        """Start knowing nothing (0 s a token)."""
        self.s_per_token = 0.0

    def learn(self, s_per_token: float) -> None:
        """Take one measurement: up at once, down by halves (never trust a quiet moment)."""
        self.s_per_token = max(s_per_token, 0.5 * (self.s_per_token + s_per_token))


class Engine:
    """Run one prompt at a time on a loaded model (callers serialise access)."""

    def __init__(self, loaded: LoadedModel, press_for_plan: PressFactory | None = None,
                 clock: Callable[[], float] = time.monotonic, exit_decoder=None,
                 variants: dict | None = None, decode_threads: int | dict = 0, mixed=None,
                 prefill_chunk: int = 0, prefix_cache=None,
                 press_cost: PressCost | None = None):
        """Wrap a loaded model; ``press_for_plan`` returns a kvpress press or None.

        ``exit_decoder`` (a LayerwiseDecoder) runs the decode steps of MODE_EARLY_EXIT
        plans; without one such plans run at full depth. ``variants`` maps a precision
        (e.g. 'int8-dynamic') to a resident copy of the model that runs the decode steps
        of plans asking for it. ``decode_threads`` > 0 sets the intra-op threads of the
        decode loop (the prefill keeps the thread's default); a dict gives it per
        precision (``MIXED`` and missing keys: the main model's). ``mixed`` (a
        runtime.precision.MixedModel) runs the decode steps of per-layer mixed plans.
        ``prefill_chunk`` > 0 prefills prompts in chunks of that many tokens (0: one pass).
        ``prefix_cache`` (a runtime.prefix_cache.PrefixCache) reuses prompt prefixes.
        ``press_cost`` (shared by the engines over one model) learns what a press adds.
        """
        self.loaded = loaded
        self.press_for_plan = press_for_plan
        self.clock = clock
        self.exit_decoder = exit_decoder
        self.variants = dict(variants or {})
        self.decode_threads = decode_threads
        self.mixed = mixed
        self.prefill_chunk = prefill_chunk
        self.prefix_cache = prefix_cache
        self.press_cost = press_cost if press_cost is not None else PressCost()

    def threads_for(self, precision: str) -> int:
        """Return the intra-op threads that decode steps at ``precision`` run with (0: as is)."""
        if not isinstance(self.decode_threads, dict):
            return self.decode_threads
        own = self.decode_threads.get(self.loaded.dtype, 0)
        return self.decode_threads.get(precision or self.loaded.dtype, own)

    @property
    def capabilities(self) -> frozenset:
        """Name what this engine can do beyond prefill and decode.

        'evict' (kvpress presses in prefill), 'prefill_decision' (plan from a layer's
        hidden states during prefill), 'move' (a sequence's cache moves between
        lanes: mid-answer precision switches), 'early_exit', 'precision' (resident
        lower-precision copies), 'logits' (lanes return logits a hook may mask).
        """
        names = {'evict', 'prefill_decision', 'move', 'logits'}
        if self.exit_decoder is not None:
            names.add('early_exit')
        if self.variants or self.mixed is not None:
            names.add('precision')
        return frozenset(names)

    @property
    def eos_ids(self) -> frozenset:
        """Return the token ids that end an answer."""
        return frozenset(self.loaded.eos_ids)

    def lane_key(self, plan: Plan) -> tuple:
        """Return the lane a plan decodes in: early exit, or its precision (and mix)."""
        if plan.mode == Mode.EARLY_EXIT and self.exit_decoder is not None:
            return EARLY_EXIT_LANE
        if plan.precision == MIXED:
            return (MIXED, tuple(plan.precision_mix))
        if plan.precision == self.loaded.dtype:
            return FULL_LANE
        return (plan.precision or '',)

    def lane(self, key: tuple):
        """Return a new, empty lane for ``key`` (ValueError for a precision not resident)."""
        if key == EARLY_EXIT_LANE:
            return ExitLane(self.exit_decoder)
        if key[0] == MIXED:
            if self.mixed is None:
                raise ValueError('no mixed-precision shell on this engine')
            mix = key[1]
            # The shell is shared by every mixed lane: each sets its mix before it steps.
            return BatchDecoder(self.mixed.apply(mix), self.loaded.device,
                                before_step=lambda: self.mixed.apply(mix))
        return BatchDecoder(self.decode_model(Plan(precision=key[0])), self.loaded.device)

    def threads(self, key: tuple):
        """Return the intra-op thread setting a lane's steps run under."""
        return intra_op_threads(self.threads_for('' if key == EARLY_EXIT_LANE else key[0]))

    def pick(self, logits) -> int:
        """Return the greedy token of a logits row."""
        return int(logits.argmax())

    def stream(self) -> 'StreamDecoder':
        """Return a new text stream for one answer."""
        return StreamDecoder(self.loaded.tokenizer, self.loaded.tokenizer_lock)

    def decode_model(self, plan: Plan):
        """Return the module that runs the plan's decode steps (ValueError if absent)."""
        if not plan.precision or plan.precision == self.loaded.dtype:
            return self.loaded.model
        if plan.precision == MIXED:
            if self.mixed is None:
                raise ValueError('no mixed-precision shell on this engine')
            return self.mixed.apply(plan.precision_mix)  # reference swaps only
        if plan.precision not in self.variants:
            raise ValueError(f'no resident {plan.precision} variant of the model')
        return self.variants[plan.precision].model

    def prefill_model(self, plan: Plan):
        """Return the module that prefills the plan's prompt (ValueError if absent)."""
        if not plan.prefill_precision or plan.prefill_precision == self.loaded.dtype:
            return self.loaded.model
        if plan.prefill_precision not in self.variants:
            raise ValueError(f'no resident {plan.prefill_precision} variant to prefill on')
        return self.variants[plan.prefill_precision].model

    def warm_up(self, tokens: int = 4, press: str = '') -> None:
        """Run short prefills and decode steps so the first real goal pays no lazy-init cost.

        With ``press`` set, one more runs under that kvpress press: importing
        kvpress and its first compression take over a second, which would
        otherwise land on the first evicting goal and overrun its estimate.
        """
        with self.loaded.tokenizer_lock:
            ids = self.loaded.tokenizer('warm up')['input_ids']
        self._warm(ids, tokens, Plan())
        for precision in self.variants:
            self._warm(ids, tokens, Plan(precision=precision))
            if precision in SIXTEEN_BIT:
                self._warm(ids, tokens, Plan(precision=precision, prefill_precision=precision))
        if press and self.press_for_plan:
            # Longer than SnapKV's 64-token observation window. Then, chunked (kvpress
            # imported by now), a prompt whose last chunk measures what a press adds.
            plan = Plan(eviction_ratio=0.5, press=press)
            self._warm((list(ids) * 80)[:160], tokens, plan)
            if self.prefill_chunk > 0:
                self._warm((list(ids) * 4 * self.prefill_chunk)[:4 * self.prefill_chunk],
                           tokens, plan)

    def _warm(self, ids, tokens: int, plan: Plan) -> None:
        """Prefill ``ids`` and run ``tokens`` - 1 steps of the plan's lane (no answer kept)."""
        cache, logits, _ = self.prefill(ids, plan)
        key = self.lane_key(plan)
        lane = self.lane(key)
        lane.join('warm-up', cache, len(ids))
        token = self.pick(logits)
        with self.threads(key):
            for _ in range(tokens - 1):
                step = lane.step({'warm-up': token})['warm-up']
                token = step.token if step.token is not None else self.pick(step.logits)

    def _prefill(self, ids, cache, plan: Plan, decide: PrefillDecision | None, stats,
                 total: int, chunked: bool):
        """Run a prefill pass under the plan's press, or under the press decided midway.

        The pass holds the prompt's last tokens (the whole prompt, or the last chunk of
        a ``total``-token one when ``chunked``); only the last position's logits are kept.
        Return (output, plan, the chunked presses that ran: each timed in ``spent_s``).
        """
        model = self.prefill_model(plan)
        made: list = []

        def press_of(chosen: Plan):
            press = self.press_for_plan(chosen, total) if self.press_for_plan else None
            if press is not None and chunked:
                from timebill_ros.runtime.deferred_press import LastChunkPress
                press = LastChunkPress(press=press)
                made.append(press)
            return press
        if decide is None:
            press = press_of(plan)
            with press(model) if press is not None else nullcontext():
                return model(input_ids=ids, past_key_values=cache, use_cache=True,
                             logits_to_keep=1), plan, made
        from timebill_ros.runtime.deferred_press import DeferredPress
        layers = model.model.layers
        if not 1 <= decide.layer <= len(layers):
            raise ValueError(f'decision layer {decide.layer} outside 1..{len(layers)}')
        deferred, decided = DeferredPress(every_pass=chunked), [plan]

        def on_layer(module, args, kwargs, output):
            decided[0] = decide.plan_from(output[0] if isinstance(output, tuple) else output)
            deferred.decide(press_of(decided[0]))

        handle = layers[decide.layer - 1].register_forward_hook(on_layer, with_kwargs=True)
        try:
            with deferred(model):
                out = model(input_ids=ids, past_key_values=cache, use_cache=True,
                            logits_to_keep=1)
        finally:
            handle.remove()
        stats.plan, stats.deferred_layers = decided[0], deferred.deferred_layers
        return out, decided[0], made

    def cached_prefix(self, prompt_ids: Sequence[int]) -> int:
        """Return how many of a prompt's first tokens the prefix cache holds now."""
        if self.prefix_cache is None:
            return 0
        return self.prefix_cache.match(prompt_ids, len(prompt_ids) - 1)

    def begin_prefill(self, prompt_ids: Sequence[int], plan: Plan,
                      decide: PrefillDecision | None = None) -> 'TorchPrefill':
        """Return a prefill of one prompt in ``prefill_chunk``-token chunks (a PrefillRun)."""
        return TorchPrefill(self, prompt_ids, plan, decide)

    def prefill(self, prompt_ids: Sequence[int], plan: Plan,
                decide: PrefillDecision | None = None, interrupt=None) -> tuple:
        """Prefill one prompt alone under the plan's press; return (cache, logits, stats).

        ``interrupt()`` is asked between chunks (PrefillInterrupted when it says stop).
        ``logits`` is the last position's row (the first answer token's, before any
        mask); the cache joins a lane. With ``decide`` the plan (and its press) is made
        during prefill from a layer's hidden states; ``stats.plan`` is the plan in force.
        """
        return finish_prefill(self.begin_prefill(prompt_ids, plan, decide), interrupt)


class TorchPrefill:
    """A prompt prefilled on the torch engine a chunk at a time (runtime.prefill.PrefillRun).

    Earlier chunks only fill the cache; the pass of the last one applies the plan's
    press to the whole cache and runs the length decision (its layer sees the prompt's
    last token, which the shipped head reads). A head pooling over the whole prompt
    (``decide.whole_prompt``) gets one pass. The last chunk holds at least
    ``LAST_CHUNK_MIN`` tokens when a press may run, for SnapKV's 64-query window (it
    scores the keys before the window: at least one).
    """

    LAST_CHUNK_MIN = 80

    def __init__(self, engine: Engine, prompt_ids: Sequence[int], plan: Plan,
                 decide: PrefillDecision | None):
        """Plan the chunks of ``prompt_ids`` under ``plan`` (nothing runs yet)."""
        from transformers import DynamicCache
        self.engine, self.ids, self.plan, self.decide = engine, list(prompt_ids), plan, decide
        self.total = len(self.ids)
        chunk = 0 if decide is not None and decide.whole_prompt else engine.prefill_chunk
        # A press runs in the last pass when the plan evicts, or may evict once decided.
        may_press = plan.eviction_ratio > 0.0 or (decide is not None and plan.mode != Mode.NONE)
        last_min = self.LAST_CHUNK_MIN if may_press else 0
        self.cache, self.logits, self.stats = DynamicCache(), None, GenerationStats()
        self.model = engine.prefill_model(plan)
        # The prefix cache holds the main model's keys and values: a copy's prefill
        # neither reuses nor stores them.
        self.prefix_cache = None if self.model is not engine.loaded.model \
            else engine.prefix_cache
        self.tokens_done = self._reuse(self.prefix_cache, max(1, last_min))
        self.stats.prefix_tokens = self.tokens_done
        self.bounds = [(self.tokens_done + b, self.tokens_done + e) for b, e in
                       chunk_bounds(self.total - self.tokens_done, chunk, last_min)]
        self.may_press = may_press

    def _reuse(self, prefix_cache, keep: int) -> int:
        """Fill the cache from the longest stored prefix leaving ``keep`` tokens; return it."""
        if prefix_cache is None:
            return 0
        reused, layers = prefix_cache.take(self.ids, self.total - keep)
        for index, (keys, values) in enumerate(layers or ()):
            self.cache.update(keys, values, index)
        return reused

    def _store(self, upto: int) -> None:
        """Keep the uncompressed blocks of the first ``upto`` prompt tokens for later goals."""
        prefix_cache = self.prefix_cache
        if prefix_cache is not None and upto >= prefix_cache.block_tokens:
            prefix_cache.store(self.ids, [(layer.keys, layer.values)
                                          for layer in self.cache.layers], upto)

    @property
    def chunks_left(self) -> int:
        """Count the chunks still to run."""
        return sum(1 for begin, _ in self.bounds if begin >= self.tokens_done)

    @property
    def next_chunk(self) -> int:
        """Count the prompt tokens the next chunk holds (0 when done)."""
        return next((end - begin for begin, end in self.bounds if begin == self.tokens_done), 0)

    @property
    def done(self) -> bool:
        """Tell whether the whole prompt is in the cache."""
        return self.tokens_done >= self.total

    @property
    def next_chunk_extra_s(self) -> float:
        """Return the seconds a press adds to the next chunk (the last one, if it may press)."""
        if not self.may_press or self.chunks_left != 1:
            return 0.0
        return self.engine.press_cost.s_per_token * self.total

    def advance(self) -> None:
        """Prefill the next chunk (the last one under the press and the length decision)."""
        import torch
        engine = self.engine
        begin, end = next(b for b in self.bounds if b[0] == self.tokens_done)
        with torch.inference_mode():
            ids = torch.tensor([self.ids[begin:end]], dtype=torch.long,
                               device=engine.loaded.device)
            t0 = engine.clock()
            if end < self.total:
                self.model(input_ids=ids, past_key_values=self.cache, use_cache=True,
                           logits_to_keep=1)
            else:
                self._last_chunk(ids, begin)
            synchronize(engine.loaded.device)
            self.stats.prefill_s += engine.clock() - t0
        self.tokens_done = end

    def _last_chunk(self, ids, begin: int) -> None:
        """Run the last chunk: the press and the length decision, the prefix cache's copy.

        The press cost is timed where it runs (the copy of the uncompressed blocks and
        the press's compression) and taught to the engine's ``press_cost``.
        """
        engine = self.engine
        t0 = engine.clock()
        if self.may_press:
            self._store(begin)  # before a press compresses the cache
        stored_s = engine.clock() - t0
        out, self.plan, presses = engine._prefill(ids, self.cache, self.plan, self.decide,
                                                  self.stats, self.total, chunked=begin > 0)
        self.logits = out.logits[0, -1]
        if not self.may_press:
            self._store(self.total)
        if presses:
            pressed_s = sum(press.spent_s for press in presses)
            engine.press_cost.learn((stored_s + pressed_s) / self.total)

    def result(self) -> tuple:
        """Return (cache, first logits, stats) of the finished prefill."""
        if not self.done:
            raise RuntimeError(f'prefill not finished ({self.tokens_done} of {self.total})')
        self.stats.kv_tokens_after_prefill = self.cache.get_seq_length()
        self.stats.plan = self.plan
        return self.cache, self.logits, self.stats

    def abandon(self) -> None:
        """Drop the partial cache."""
        self.cache = None
