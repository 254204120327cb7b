# SPDX-License-Identifier: Apache-2.0
"""The node's resident engines behind one backend: the main engine and others by option.

The planner may run a whole goal on another resident engine (a GGUF model on
llama.cpp, ``runtime.llama_engine``): such a plan names the engine's option in
``Plan.precision`` (``core.cut_kinds.OtherEngine``). A plan may prefill on one such option
and decode on another (``core.cut_kinds.HandOver``). This backend routes the goal's
prefill and its lane to that engine and everything else to the main one, so the one
decode loop steps lanes of both in the same rounds.
"""

from __future__ import annotations

from typing import Sequence

from timebill_ros.core.planning import Plan
from timebill_ros.runtime.prefill import finish_prefill


class ResidentEngines:
    """Route each plan to the engine it names (``others``) or to ``main``."""

    def __init__(self, main, others: dict):
        """Serve with ``main`` (the torch engine) and ``others`` (option -> backend)."""
        self.main, self.others = main, dict(others)

    @property
    def capabilities(self) -> frozenset:
        """Return what the main engine can do (the planner keeps other engines to theirs)."""
        return self.main.capabilities

    @property
    def eos_ids(self) -> frozenset:
        """Return the token ids that end an answer (every engine shares the vocabulary)."""
        return self.main.eos_ids

    @property
    def clock(self):
        """Return the main engine's clock."""
        return self.main.clock

    def _of_plan(self, plan: Plan):
        return self.others.get(plan.precision, self.main)

    def _of_lane(self, key: tuple):
        return self.others.get(key[0], self.main) if key else self.main

    def prefill(self, prompt_ids: Sequence[int], plan: Plan, decide=None,
                interrupt=None) -> tuple:
        """Prefill on the plan's engine; return (cache, logits, stats)."""
        return finish_prefill(self.begin_prefill(prompt_ids, plan, decide), interrupt)

    def cached_prefix(self, prompt_ids: Sequence[int]) -> int:
        """Return the main engine's cached prefix of a prompt (other engines keep none)."""
        return self.main.cached_prefix(prompt_ids)

    def cached_prefixes(self, prompt_ids: Sequence[int]) -> dict:
        """Return {option: prompt tokens it holds from an earlier prompt} (none: left out)."""
        held = {option: engine.cached_prefix(prompt_ids)
                for option, engine in self.others.items() if hasattr(engine, 'cached_prefix')}
        return {option: tokens for option, tokens in held.items() if tokens}

    def begin_prefill(self, prompt_ids: Sequence[int], plan: Plan, decide=None):
        """Begin a chunked prefill on the plan's engine (a runtime.prefill.PrefillRun).

        A plan that prefills on another option than it decodes on
        (``core.cut_kinds.HandOver``) hands the prompt's KV over when its prefill ends.
        """
        target, source = self._of_plan(plan), self.others.get(plan.prefill_precision)
        if source is not None and source is not target:
            return source.begin_handover(prompt_ids, plan, target)
        return target.begin_prefill(prompt_ids, plan, decide)

    def lane_key(self, plan: Plan) -> tuple:
        """Return the lane of the plan's engine (keyed by the option for another engine)."""
        return self._of_plan(plan).lane_key(plan)

    def lane(self, key: tuple):
        """Return a new lane of the engine ``key`` belongs to."""
        return self._of_lane(key).lane(key)

    def threads(self, key: tuple):
        """Return the thread setting of the lane's engine."""
        return self._of_lane(key).threads(key)

    def pick(self, logits) -> int:
        """Return the greedy token of a logits row (a torch tensor or a numpy array)."""
        return int(logits.argmax())

    def stream(self):
        """Return a text stream for one answer (the shared tokenizer)."""
        return self.main.stream()
