"""Prefill + greedy decode loop with a per-token hook, correct positions after eviction."""

from __future__ import annotations

from contextlib import nullcontext
import time
from typing import Callable, Sequence

from timebill_ros.core.execution import GenerationStats, PrefillDecision, TokenEvent
from timebill_ros.core.planning import MIXED, Plan
from timebill_ros.core.request import Mode
from timebill_ros.runtime.model import intra_op_threads, LoadedModel, match_cache, synchronize


class StreamDecoder:
    """Turn token ids into text deltas whose concatenation is the decoded text.

    A byte-level BPE token can end inside a UTF-8 character; such text is held
    back until the character is complete, so no delta ever has to be retracted.
    """

    def __init__(self, tokenizer, lock=None):
        """Start with no tokens; ``lock`` guards a tokenizer shared across threads."""
        self._tok = tokenizer
        self._lock = lock if lock is not None else nullcontext()
        self._ids: list = []
        self._text = ''

    def push(self, token_id: int) -> str:
        """Add a token and return the new text it completes (may be '')."""
        self._ids.append(token_id)
        with self._lock:
            text = self._tok.decode(self._ids, skip_special_tokens=True,
                                    clean_up_tokenization_spaces=False)
        if text.endswith('\ufffd') or not text.startswith(self._text):
            return ''
        delta, self._text = text[len(self._text):], text
        return delta

    @property
    def text(self) -> str:
        """Return the text emitted so far."""
        return self._text


PressFactory = Callable[[Plan, int], object]  # (plan, prompt tokens) -> press or None


class Engine:
    """Run one prompt at a time on a loaded model (callers serialise access)."""

    def __init__(self, loaded: LoadedModel, press_for_plan: PressFactory | None = None,
                 clock: Callable[[], float] = time.monotonic, exit_decoder=None,
                 variants: dict | None = None, decode_threads: int | dict = 0, mixed=None):
        """Wrap a loaded model; ``press_for_plan`` returns a kvpress press or None.

        ``exit_decoder`` (a LayerwiseDecoder) runs the decode steps of MODE_EARLY_EXIT
        plans; without one such plans run at full depth. ``variants`` maps a precision
        (e.g. 'int8-dynamic') to a resident copy of the model that runs the decode steps
        of plans asking for it. ``decode_threads`` > 0 sets the intra-op threads of the
        decode loop (the prefill keeps the thread's default); a dict gives it per
        precision (``MIXED`` and missing keys: the main model's). ``mixed`` (a
        runtime.precision.MixedModel) runs the decode steps of per-layer mixed plans.
        """
        self.loaded = loaded
        self.press_for_plan = press_for_plan
        self.clock = clock
        self.exit_decoder = exit_decoder
        self.variants = dict(variants or {})
        self.decode_threads = decode_threads
        self.mixed = mixed

    def threads_for(self, precision: str) -> int:
        """Return the intra-op threads that decode steps at ``precision`` run with (0: as is)."""
        if not isinstance(self.decode_threads, dict):
            return self.decode_threads
        own = self.decode_threads.get(self.loaded.dtype, 0)
        return self.decode_threads.get(precision or self.loaded.dtype, own)

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

    def warm_up(self, tokens: int = 4, press: str = '') -> None:
        """Run short generations so the first real goal pays no lazy-init cost.

        With ``press`` set, one more runs under that kvpress press: importing
        kvpress and its first compression take over a second, which would
        otherwise land on the first evicting goal and overrun its estimate.
        """
        with self.loaded.tokenizer_lock:
            ids = self.loaded.tokenizer('warm up')['input_ids']
        self.generate(ids, tokens, Plan(), lambda event: True)
        for precision in self.variants:
            self.generate(ids, tokens, Plan(precision=precision), lambda event: True)
        if press and self.press_for_plan:
            # Longer than SnapKV's 64-token observation window.
            long_ids = (list(ids) * 80)[:160]
            self.generate(long_ids, tokens, Plan(eviction_ratio=0.5, press=press),
                          lambda event: True)

    def _prefill(self, ids, cache, plan: Plan, decide: PrefillDecision | None, stats):
        """Run the prefill under the plan's press, or under the press decided midway."""
        model = self.loaded.model
        if decide is None:
            press = self.press_for_plan(plan, ids.shape[1]) if self.press_for_plan else None
            with press(model) if press is not None else nullcontext():
                return model(input_ids=ids, past_key_values=cache, use_cache=True), plan
        from timebill_ros.runtime.deferred_press import DeferredPress
        layers = model.model.layers
        if not 1 <= decide.layer <= len(layers):
            raise ValueError(f'decision layer {decide.layer} outside 1..{len(layers)}')
        deferred, decided = DeferredPress(), [plan]

        def on_layer(module, args, kwargs, output):
            decided[0] = decide.plan_from(output[0] if isinstance(output, tuple) else output)
            press = self.press_for_plan(decided[0], ids.shape[1]) \
                if self.press_for_plan else None
            deferred.decide(press)

        handle = layers[decide.layer - 1].register_forward_hook(on_layer, with_kwargs=True)
        try:
            with deferred(model):
                out = model(input_ids=ids, past_key_values=cache, use_cache=True)
        finally:
            handle.remove()
        stats.plan, stats.deferred_layers = decided[0], deferred.deferred_layers
        return out, decided[0]

    def prefill(self, prompt_ids: Sequence[int], plan: Plan,
                decide: PrefillDecision | None = None) -> tuple:
        """Prefill one prompt alone under the plan's press; return (cache, first token, stats).

        For a sequence that decodes in a batch (runtime/batch.py).
        """
        import torch
        from transformers import DynamicCache
        stats = GenerationStats()
        with torch.inference_mode():
            ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=self.loaded.device)
            cache = DynamicCache()
            t0 = self.clock()
            out, plan = self._prefill(ids, cache, plan, decide, stats)
            first = int(out.logits[0, -1].argmax())  # on CUDA this waits for the prefill
            synchronize(self.loaded.device)
            stats.prefill_s = self.clock() - t0
            stats.kv_tokens_after_prefill = cache.get_seq_length()
        stats.plan = plan
        return cache, first, stats

    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int, plan: Plan,
                 on_token: Callable[[TokenEvent], bool],
                 token_budget: Callable[[int], float | None] | None = None,
                 decide: PrefillDecision | None = None,
                 switch: Callable[[int], str] | None = None) -> GenerationStats:
        """Prefill (under the plan's press) then decode greedily, one token per step.

        ``token_budget(i)`` gives the seconds decode step i may take (early exit only).
        With ``decide`` the plan (and its press) is made during prefill from a
        layer's hidden states; ``stats.plan`` is that plan.
        ``switch(i)`` names a resident precision decode step i and the rest run at
        ('' = stay); the KV cache carries over, as it does from prefill.
        """
        cache, next_id, stats = self.prefill(prompt_ids, plan, decide)
        return self.decode(cache, next_id, len(prompt_ids), max_new_tokens, stats, on_token,
                           token_budget, switch)

    def decode(self, cache, next_id: int, n_prompt: int, max_new_tokens: int,
               stats: GenerationStats, on_token: Callable[[TokenEvent], bool],
               token_budget: Callable[[int], float | None] | None = None,
               switch: Callable[[int], str] | None = None) -> GenerationStats:
        """Decode alone from a prefilled cache under ``stats.plan``; fill and return ``stats``."""
        plan = stats.plan
        layerwise = self.exit_decoder if plan.mode == Mode.EARLY_EXIT else None
        decoder = StreamDecoder(self.loaded.tokenizer, self.loaded.tokenizer_lock)
        model = self.decode_model(plan)
        if layerwise is None:
            match_cache(cache, model)
        with intra_op_threads(self.threads_for(plan.precision)):
            return self._decode(model, layerwise, next_id, cache, n_prompt,
                                max_new_tokens, on_token, token_budget, stats, decoder,
                                switch)

    def _decode(self, model, layerwise, next_id, cache, n_prompt, max_new_tokens, on_token,
                token_budget, stats, decoder, switch=None) -> GenerationStats:
        """Decode greedily from the first token; fill and return ``stats``."""
        import torch
        device = self.loaded.device
        with torch.inference_mode():
            stats.kv_tokens_after_prefill = cache.get_seq_length()
            step_ids = torch.empty((1, 1), dtype=torch.long, device=device)
            position = torch.empty((1, 1), dtype=torch.long, device=device)
            for index in range(max_new_tokens):
                if next_id in self.loaded.eos_ids:
                    stats.stop = 'eos'
                    return stats
                stats.tokens += 1
                event = TokenEvent(index=index, token_id=next_id,
                                   text_delta=decoder.push(next_id), time=self.clock())
                if not on_token(event):
                    stats.stop = 'stopped'
                    return stats
                if index + 1 == max_new_tokens:
                    break
                if switch is not None and layerwise is None and stats.switched_at < 0:
                    to = switch(index)
                    if to in self.variants:
                        model = self.variants[to].model
                        match_cache(cache, model)
                        stats.switched_at, stats.switched_to = index, to
                        torch.set_num_threads(self.threads_for(to) or torch.get_num_threads())
                t = self.clock()
                if layerwise is not None:
                    step = layerwise.step(next_id, n_prompt + index, cache,
                                          token_budget(index) if token_budget else None)
                    next_id = step.token_id
                    stats.exit_kinds.append(step.kind)
                    stats.step_times.append(self.clock() - t)
                    continue
                step_ids[0, 0] = next_id
                # Explicit positions: after eviction the cache is shorter than the
                # prompt, and RoPE must still see the token's true position.
                position[0, 0] = n_prompt + index
                out = model(input_ids=step_ids, past_key_values=cache,
                            position_ids=position, use_cache=True)
                next_id = int(out.logits[0, -1].argmax())
                stats.step_times.append(self.clock() - t)
        stats.stop = 'max_tokens'
        return stats
