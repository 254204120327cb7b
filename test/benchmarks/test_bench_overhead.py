# SPDX-License-Identifier: Apache-2.0
"""The overhead benchmark's bare llama.cpp loop runs the kernels the node runs."""

from benchmarks import bench_overhead


def test_the_bare_llama_loop_loads_as_the_node_does_and_decodes_greedy():
    from llama_cpp import llama_cpp as lib
    from transformers import AutoTokenizer
    from timebill_ros.runtime.model import embedded_dir, prompt_ids
    amx = b'AMX_INT8 = 1' in lib.llama_print_system_info()
    with bench_overhead.node_model_params() as params:
        assert lib.llama_model_default_params().use_extra_bufts is not amx
        assert params.use_extra_bufts is not amx
    assert lib.llama_model_default_params().use_extra_bufts  # the library's own again
    # The shipped Q4_1 decodes through Llama here (it died with SIGILL on an AMX CPU).
    loop = bench_overhead.llama_loop('q4_1')
    ids = prompt_ids(AutoTokenizer.from_pretrained(embedded_dir()), 'Say the word stop.')
    tokens, prefill_s, decode_s = loop(None, ids, 8)
    assert 1 <= tokens <= 8 and prefill_s > 0.0 and decode_s >= 0.0
