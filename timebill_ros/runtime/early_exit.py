# SPDX-License-Identifier: Apache-2.0
"""Layer-by-layer decode steps that may commit an intermediate layer's token.

For a Llama-style transformers model (SmolLM2): the decode step runs
``model.model.layers`` one at a time; after each candidate exit layer the hidden
state goes through the final norm and the LM head (the logit lens) and the
``ExitRule`` decides. A token that exits after layer l still owes keys/values to
layers l+1..L for later tokens: as CALM does, they are computed from the exit
hidden state (each skipped layer's input norm, k/v projections and RoPE at the
token's position) and appended, so every layer's cache keeps the same length
and no position is a hole.
"""

from __future__ import annotations

from dataclasses import dataclass
import statistics
import time
from typing import Callable

from timebill_ros.core.early_exit import CONTINUE, ExitRule, FULL, LayerTimes
from timebill_ros.runtime.batch import KeyedLane, LaneStep
from timebill_ros.runtime.model import LoadedModel, synchronize


@dataclass
class ExitStep:
    """One decode step's outcome."""

    token_id: int
    layer: int        # 1-based layer whose prediction was committed (L = full depth)
    confidence: float
    kind: str         # 'full', 'threshold' or 'forced'
    seconds: float
    logits: object = None  # the committing layer's logits row (a goal's grammar masks it)


class LayerwiseDecoder:
    """Run decode steps layer by layer with early exits (batch size 1)."""

    def __init__(self, loaded: LoadedModel, rule: ExitRule | None, times: LayerTimes | None,
                 clock: Callable[[], float] = time.monotonic, heads=None,
                 exact_kv: bool = False):
        """Keep the model parts; ``rule`` None never exits early (full depth).

        ``heads`` (ExitHeads) replaces the logit lens at the layers it has a map for.
        ``exact_kv`` (measurement only: it saves no time) still runs the skipped layers
        for their true K/V after an exit, isolating the K/V fill's quality effect.
        """
        inner = loaded.model.model
        self.layers, self.norm, self.embed = inner.layers, inner.norm, inner.embed_tokens
        self.rotary, self.head = inner.rotary_emb, loaded.model.lm_head
        self.num_layers = len(self.layers)
        if rule is not None and rule.exit_layers[-1] > self.num_layers:
            raise ValueError(f'exit layer {rule.exit_layers[-1]} > {self.num_layers} layers')
        self.rule, self.times, self.clock, self.heads = rule, times, clock, heads
        self.exact_kv = exact_kv
        self._candidates = frozenset(rule.exit_layers) if rule else frozenset()

    def _logits(self, hidden, layer: int = 0):
        if self.heads is not None and layer in self.heads.maps:
            return self.head(self.heads.apply(layer, hidden))[0, -1]
        return self.head(self.norm(hidden))[0, -1]

    def step(self, token_id: int, position: int, cache,
             token_budget_s: float | None = None) -> ExitStep:
        """Append ``token_id`` at ``position`` to the cache; return the next token."""
        import torch
        start = self.clock()
        with torch.inference_mode():
            ids = torch.tensor([[token_id]], device=self.embed.weight.device)
            pos = torch.tensor([[position]], device=ids.device)
            hidden = self.embed(ids)
            rotary = self.rotary(hidden, pos)
            for index, layer in enumerate(self.layers):
                hidden = layer(hidden, position_ids=pos, past_key_values=cache, use_cache=True,
                               position_embeddings=rotary)
                hidden = hidden[0] if isinstance(hidden, tuple) else hidden
                depth = index + 1
                if depth in self._candidates and depth < self.num_layers:
                    logits = self._logits(hidden, depth)
                    probs = torch.softmax(logits.float(), dim=-1)
                    confidence, best = probs.max(dim=-1)
                    kind = self.rule.decide(depth, float(confidence), self.clock() - start,
                                            token_budget_s, self.times)
                    if kind != CONTINUE:
                        if self.exact_kv:
                            self._run_rest(hidden, depth, pos, rotary, cache)
                        else:
                            self._fill_skipped(hidden, depth, rotary, cache)
                        return ExitStep(int(best), depth, float(confidence), kind,
                                        self.clock() - start, logits)
            logits = self._logits(hidden)
            probs = torch.softmax(logits.float(), dim=-1)
            confidence, best = probs.max(dim=-1)
        return ExitStep(int(best), self.num_layers, float(confidence), FULL,
                        self.clock() - start, logits)

    def _run_rest(self, hidden, depth: int, pos, rotary, cache) -> None:
        """Run the layers after ``depth`` only for their K/V (exact cache, no saving)."""
        for layer in self.layers[depth:]:
            hidden = layer(hidden, position_ids=pos, past_key_values=cache, use_cache=True,
                           position_embeddings=rotary)
            hidden = hidden[0] if isinstance(hidden, tuple) else hidden

    def _fill_skipped(self, hidden, depth: int, rotary, cache) -> None:
        """Give layers after ``depth`` this token's K/V, computed from the exit state."""
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
        cos, sin = rotary
        for index in range(depth, self.num_layers):
            attn = self.layers[index].self_attn
            x = self.layers[index].input_layernorm(hidden)
            shape = (*x.shape[:-1], -1, attn.head_dim)
            key = attn.k_proj(x).view(shape).transpose(1, 2)
            value = attn.v_proj(x).view(shape).transpose(1, 2)
            key, _ = apply_rotary_pos_emb(key, key, cos, sin)
            cache.update(key, value, index, {'sin': sin, 'cos': cos})


def measure_layer_times(loaded: LoadedModel, n_kv: int = 512, steps: int = 8) -> LayerTimes:
    """Time each decoder layer and the head over ``steps`` decode steps at ``n_kv`` cached."""
    import torch
    from transformers import DynamicCache
    inner = loaded.model.model
    per_layer = [[] for _ in inner.layers]
    heads = []
    with torch.inference_mode():
        cache = DynamicCache()
        ids = torch.randint(1000, 2000, (1, n_kv), generator=torch.Generator().manual_seed(0))
        loaded.model(input_ids=ids.to(loaded.device), past_key_values=cache, use_cache=True)
        for step in range(steps + 1):  # the first step warms up and is not kept
            pos = torch.tensor([[n_kv + step]], device=loaded.device)
            hidden = inner.embed_tokens(torch.tensor([[1500]], device=loaded.device))
            rotary = inner.rotary_emb(hidden, pos)
            synchronize(loaded.device)
            for index, layer in enumerate(inner.layers):
                t0 = time.perf_counter()
                hidden = layer(hidden, position_ids=pos, past_key_values=cache, use_cache=True,
                               position_embeddings=rotary)
                hidden = hidden[0] if isinstance(hidden, tuple) else hidden
                synchronize(loaded.device)  # CUDA: time the layer's work, not its launch
                if step:
                    per_layer[index].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            int(loaded.model.lm_head(inner.norm(hidden))[0, -1].argmax())
            if step:
                heads.append(time.perf_counter() - t0)
    return LayerTimes(tuple(statistics.median(t) for t in per_layer), statistics.median(heads))


class ExitLane(KeyedLane):
    """A lane of one sequence decoding layer by layer with early exits.

    Exclusive: while it holds a goal the other lanes wait, so the goal's per-token
    budget is its own step's time (the exit rule judges the time within one step).
    """

    exclusive = True

    def __init__(self, decoder: LayerwiseDecoder):
        """Step sequences on ``decoder``."""
        super().__init__()
        self.decoder = decoder

    def cached_tokens(self) -> int:
        """Return the longest cache's length."""
        return max((cache.get_seq_length() for cache, _ in self._members.values()), default=0)

    def step(self, feed: dict, budgets: dict | None = None) -> dict:
        """Run one layer-by-layer step per sequence; return key -> LaneStep (its token)."""
        out = {}
        for key, state in self._members.items():
            cache, position = state
            budget = (budgets or {}).get(key)
            step = self.decoder.step(feed[key], position, cache, budget)
            state[1] = position + 1
            out[key] = LaneStep(token=step.token_id, kind=step.kind, logits=step.logits)
        return out
