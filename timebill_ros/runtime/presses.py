# SPDX-License-Identifier: Apache-2.0
"""KV-cache eviction with NVIDIA kvpress: a press per goal, applied around prefill only."""

from __future__ import annotations

from timebill_ros.core.eviction import press_skip_reason

PRESSES = ('snapkv', 'streamingllm', 'knorm', 'expected_attention')


def make_press(name: str, ratio: float):
    """Return a kvpress press evicting ``ratio`` of the prompt's KV pairs, or None at 0.

    SnapKV (TimeBill's choice) scores keys with the attention of the last 64
    prompt tokens; the whole prompt, question included, is compressed, as in
    TimeBill (kvpress's own pipeline would keep the question uncompressed).
    """
    if name not in PRESSES:
        raise ValueError(f'unknown press {name!r} (expected one of {PRESSES})')
    if not 0.0 <= ratio < 1.0:
        raise ValueError(f'eviction ratio must be in [0, 1) (got {ratio})')
    if ratio == 0.0:
        return None
    import kvpress
    if name == 'snapkv':
        return kvpress.SnapKVPress(compression_ratio=ratio)
    if name == 'streamingllm':
        return kvpress.StreamingLLMPress(compression_ratio=ratio)
    if name == 'knorm':
        return kvpress.KnormPress(compression_ratio=ratio)
    return kvpress.ExpectedAttentionPress(compression_ratio=ratio)


def press_for_plan(plan, prompt_tokens: int | None = None):
    """Build the press an InferencePlan asks for (None when it evicts nothing).

    With ``prompt_tokens`` a press the prompt is too short for is skipped
    (core.eviction.press_skip_reason); the planner already plans no eviction
    there and says so in the plan's note, this only guards other callers.
    """
    if plan.eviction_ratio <= 0.0:
        return None
    name, ratio = plan.press or 'snapkv', float(plan.eviction_ratio)
    if prompt_tokens is not None and press_skip_reason(name, prompt_tokens, ratio):
        return None
    return make_press(name, ratio)
