# SPDX-License-Identifier: Apache-2.0
"""bench_llama_batch times one llama_decode of 1..N sequences on the node's own context."""

from benchmarks.bench_llama_batch import markdown, step_times
from timebill_ros.runtime.llama_engine import LlamaModel
from timebill_ros.runtime.model import embedded_gguf


def test_times_every_batch_size_and_frees_the_sequences():
    model = LlamaModel(embedded_gguf(), 64, 2, 16, 2)
    try:
        row = step_times(model, 2, 8, 3)
        assert sorted(row['step_s']) == [1, 2] and row['prefill_s'] > 0
        assert all(step > 0 for step in row['step_s'].values())
        assert sorted(model.acquire() for _ in range(2)) == [0, 1]  # both were released
    finally:
        model.close()
    table = markdown({'date': 'd', 'machine': 'm', 'command': 'c', 'commit': 'x', 'prompt': 8,
                      'steps': 3, 'threads': 2, 'formats': {'q4_1': row}})
    assert '| 2 |' in table and 'throughput x one' in table
