# SPDX-License-Identifier: Apache-2.0
"""The resident engines: what each other engine holds of a prompt."""

from timebill_ros.serving.resident import ResidentEngines


class Holding:
    """An engine option holding the first ``n`` tokens of every prompt."""

    def __init__(self, n):
        self.n = n

    def cached_prefix(self, prompt_ids):
        return min(self.n, len(prompt_ids) - 1)


class Remote:
    """An engine that keeps no prompt (no cached_prefix)."""


def test_each_other_engine_says_what_it_holds_and_those_holding_nothing_are_left_out():
    engines = ResidentEngines(main=object(), others={
        'llama.cpp-f16': Holding(40), 'llama.cpp-q4_1': Holding(0), 'remote': Remote()})
    assert engines.cached_prefixes(list(range(100))) == {'llama.cpp-f16': 40}
    assert engines.cached_prefixes([1, 2]) == {'llama.cpp-f16': 1}
