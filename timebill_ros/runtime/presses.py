"""KV-cache eviction with NVIDIA kvpress: a press per goal, applied around prefill only."""

from __future__ import annotations

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


def press_for_plan(plan):
    """Build the press an InferencePlan asks for (None when it evicts nothing)."""
    if plan.eviction_ratio <= 0.0:
        return None
    return make_press(plan.press or 'snapkv', float(plan.eviction_ratio))
