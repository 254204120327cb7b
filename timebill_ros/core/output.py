# SPDX-License-Identifier: Apache-2.0
"""What a goal asks of its answer: chat turns, stop strings, sampling, a schema or grammar.

``OutputSpec`` is validated once with the goal (``validate_output``); the engine-side
pieces (the chat template, llguidance, the sampler) read it. ``StopReason`` is why an
answer ended, reported beside the outcome.
"""

from __future__ import annotations

from dataclasses import dataclass
import enum
import math

ROLES = ('system', 'user', 'assistant')
MAX_STOP_STRINGS = 8
MAX_TEMPERATURE = 2.0


class StopReason(enum.IntEnum):
    """Why an answer ended (the Instruct result's stop_reason constants)."""

    NONE = 0  # it never ran (rejected, skipped, canceled or killed before a token)
    END_OF_ANSWER = 1
    MAX_TOKENS = 2
    STOP_SEQUENCE = 3
    KILLED = 4  # Kill at the deadline cut it (a schema goal whose closure was not found)
    CLOSED_AT_DEADLINE = 5  # the structure was completed without the model at the deadline
    CANCELED = 6
    FAILED = 7


# GenerationStats.stop -> StopReason
ENGINE_STOPS = {'eos': StopReason.END_OF_ANSWER, 'max_tokens': StopReason.MAX_TOKENS,
                'stop_string': StopReason.STOP_SEQUENCE,
                'closed': StopReason.CLOSED_AT_DEADLINE}


@dataclass(frozen=True)
class OutputSpec:
    """A goal's chat turns, stop strings, sampling, and schema or grammar."""

    system_prompt: str = ''
    history: tuple = ()  # ((role, content), ...) before the instruction
    stop: tuple = ()  # strings that end the answer (kept in the text, as streamed)
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    seed: int = 0  # 0 = not repeatable
    json_schema: str = ''
    grammar: str = ''  # GBNF

    @property
    def constrained(self) -> bool:
        """Tell whether a schema or grammar constrains the answer."""
        return bool(self.json_schema or self.grammar)

    @property
    def sampled(self) -> bool:
        """Tell whether tokens are drawn at random rather than taken greedily."""
        return self.temperature > 0.0

    @property
    def plain(self) -> bool:
        """Tell whether the answer is greedy free text with no stop strings."""
        return not (self.constrained or self.sampled or self.stop)


def validate_output(system_prompt: str = '', history=(), stop=(), temperature: float = 0.0,
                    top_p: float = 0.0, seed: int = 0, json_schema: str = '',
                    grammar: str = '') -> OutputSpec:
    """Check a goal's output fields; raise ValueError with the reason.

    ``top_p`` 0 means 1 (the message default); ``history`` is (role, content) pairs.
    """
    turns = tuple((str(role).strip(), str(content)) for role, content in history)
    for index, (role, _) in enumerate(turns):
        if role not in ROLES:
            raise ValueError(f'history[{index}].role {role!r} is not one of {", ".join(ROLES)}')
    stops = tuple(str(text) for text in stop)
    if len(stops) > MAX_STOP_STRINGS or any(not text for text in stops):
        raise ValueError(f'stop takes at most {MAX_STOP_STRINGS} non-empty strings '
                         f'(got {list(stops)!r})')
    temperature, top_p = float(temperature), float(top_p) or 1.0
    if not math.isfinite(temperature) or not 0.0 <= temperature <= MAX_TEMPERATURE:
        raise ValueError(f'temperature must be in [0, {MAX_TEMPERATURE:g}] (got {temperature:g})')
    if not math.isfinite(top_p) or not 0.0 < top_p <= 1.0:
        raise ValueError(f'top_p must be in (0, 1] or 0 for 1 (got {top_p:g})')
    if int(seed) < 0:
        raise ValueError(f'seed must be >= 0 (got {seed})')
    json_schema, grammar = (json_schema or '').strip(), (grammar or '').strip()
    if json_schema and grammar:
        raise ValueError('give a json_schema or a grammar, not both')
    return OutputSpec(system_prompt=(system_prompt or '').strip(), history=turns, stop=stops,
                      temperature=temperature, top_p=top_p, seed=int(seed),
                      json_schema=json_schema, grammar=grammar)
