# SPDX-License-Identifier: Apache-2.0
"""The vLLM copy of the embedded model decodes plain text and keeps the chat template."""

from transformers import AutoTokenizer

from timebill_ros.runtime.export_vllm import export_for_vllm
from timebill_ros.runtime.model import embedded_dir


def test_the_copy_decodes_without_byte_markers_and_ends_answers_at_im_end(tmp_path):
    source = embedded_dir()
    target = export_for_vllm(source, tmp_path / 'vllm')
    copy, original = AutoTokenizer.from_pretrained(target), AutoTokenizer.from_pretrained(source)
    text = 'The world is big, and the robot turns left.'
    ids = copy.encode(text, add_special_tokens=False)
    assert ids == original.encode(text, add_special_tokens=False)  # same token ids
    assert copy.decode(ids) == text and 'Ġ' not in copy.decode(ids)
    assert copy.eos_token == '<|im_end|>' and copy.eos_token_id == 2
    chat = [{'role': 'user', 'content': 'Hi'}]
    assert copy.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == \
        original.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    # The weights are shared, not copied.
    assert (target / 'model.safetensors').stat().st_size == \
        (source / 'model.safetensors').stat().st_size
