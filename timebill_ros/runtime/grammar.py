# SPDX-License-Identifier: Apache-2.0
"""Constrained decoding with llguidance: JSON Schema and GBNF goals, and their closure.

A ``GrammarLibrary`` per tokenizer compiles a goal's JSON Schema or GBNF grammar into
llguidance's grammar (cached by text; an invalid one raises ``GrammarError`` with the
library's reason) and makes one ``Constraint`` per goal: an ``LLMatcher`` that masks a
logits row (any engine's: torch or numpy, one mask for every lane), takes each token
the goal streams, and, when the deadline ends the goal, finds a short token sequence
that completes the structure (``closure``) without running the model.

llguidance was chosen over xgrammar by ``python -m benchmarks.bench_grammar``
(docs/structured_output.md): it reads JSON Schema and GBNF, has no dependencies, and
its matcher rolls back, which the closure search needs.
"""

from __future__ import annotations

from collections import OrderedDict
import json
import threading
import time

import numpy as np

# JSON written the way the model writes it (a space after ':' and ','), and no free
# whitespace: a free-whitespace grammar lets a small model loop on newlines.
JSON_OPTIONS = {'whitespace_flexible': False, 'item_separator': ', ', 'key_separator': ': '}
# What a closure tries first where many tokens are legal (inside a string, after a value):
# the characters that end a value, a string, an array, an object, and the shortest values.
CLOSERS = ('"', ' ', '}', ']', '"}', '"]', '}]', ']}', '"},', ', ', ': ', ',', ':', '0', '1',
           'false', 'true', 'null', '""', '[]', '{}', '\n', '.', '0.')
FEW_LEGAL = 48  # below this many legal tokens the closure tries them all, shortest first


class GrammarError(ValueError):
    """A JSON Schema or grammar llguidance cannot use; the message is its reason."""


class GrammarLibrary:
    """Compile goal grammars for one tokenizer (cached) and make their constraints."""

    def __init__(self, tokenizer, eos_ids, cache_size: int = 64):
        """Wrap ``tokenizer`` (a fast Hugging Face tokenizer) for llguidance (~1.5 s).

        ``eos_ids`` end an answer (the engine's): legal once the structure is complete.
        """
        import llguidance
        self.vocab_size = len(tokenizer)
        self.eos_ids = frozenset(int(i) for i in eos_ids)
        self.ll_tokenizer = llguidance.LLTokenizer(
            _byte_level_json(tokenizer), n_vocab=self.vocab_size, eos_token=sorted(self.eos_ids))
        self._texts = [tokenizer.decode([i]) for i in range(self.vocab_size)]
        self._closers = self._closer_ids(tokenizer)
        self._cache: OrderedDict = OrderedDict()
        self._shortest: dict = {}  # compiled grammar -> tokens of its shortest answer
        self._cache_size, self._lock = cache_size, threading.Lock()
        self.compile_s: list = []  # seconds of each compilation (not cache hits)

    def _closer_ids(self, tokenizer) -> list:
        """Return the single-token ids of ``CLOSERS`` in preference order."""
        ids = []
        for text in CLOSERS:
            encoded = tokenizer(text, add_special_tokens=False)['input_ids']
            if len(encoded) == 1 and encoded[0] not in ids:
                ids.append(encoded[0])
        return ids

    def compile(self, json_schema: str = '', grammar: str = '') -> str:
        """Return llguidance's grammar for a schema or a GBNF grammar (one of them).

        Raise GrammarError with the library's reason when it cannot be used.
        """
        import llguidance
        if bool(json_schema) == bool(grammar):
            raise GrammarError('give a json_schema or a grammar, not both')
        key = ('schema', json_schema) if json_schema else ('gbnf', grammar)
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        start = time.perf_counter()
        try:
            if json_schema:
                json.loads(json_schema)
                compiled = llguidance.LLMatcher.grammar_from_json_schema(
                    json_schema, overrides=JSON_OPTIONS)
            else:
                compiled = llguidance.grammar_from('gbnf', grammar)
        except ValueError as exc:  # json.JSONDecodeError is one
            raise GrammarError(f'{key[0]} does not parse: {exc}') from None
        error = llguidance.LLMatcher.validate_grammar(compiled, self.ll_tokenizer)
        if error and not error.startswith('WARNING'):
            raise GrammarError(f'{key[0]} rejected by llguidance: {error}')
        probe = llguidance.LLMatcher(self.ll_tokenizer, compiled, log_level=0)
        if probe.is_error():
            raise GrammarError(f'{key[0]} rejected by llguidance: {probe.get_error()}')
        self.compile_s.append(time.perf_counter() - start)
        with self._lock:
            self._cache[key] = compiled
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return compiled

    def shortest_answer(self, compiled: str) -> int:
        """Return the tokens of the grammar's shortest whole answer (0 when none is found).

        The closure from the start: the fewest tokens a goal under this grammar can
        answer in, which bounds its length from below. Cached per grammar (0.4-9 ms).
        """
        with self._lock:
            known = self._shortest.get(compiled)
        if known is None:
            found = self.constraint(compiled).closure(max_tokens=256, time_limit_s=0.5)
            known = len(found) if found is not None else 0
            with self._lock:
                self._shortest[compiled] = known
                while len(self._shortest) > self._cache_size:
                    self._shortest.pop(next(iter(self._shortest)))
        return known

    def constraint(self, compiled: str) -> 'Constraint':
        """Return a fresh matcher for one goal, at the start of a compiled grammar."""
        import llguidance
        return Constraint(self, llguidance.LLMatcher(self.ll_tokenizer, compiled, log_level=0))


class Constraint:
    """One goal's grammar state: the legal next tokens, and a closure at the deadline."""

    def __init__(self, library: GrammarLibrary, matcher):
        """Start at the beginning of the answer."""
        self.library, self.matcher = library, matcher
        self._mask = np.zeros((library.vocab_size + 31) // 32, dtype=np.int32)
        self.mask_s = 0.0  # seconds spent computing masks (telemetry: cost per token)
        self.masks = 0

    def legal(self) -> np.ndarray:
        """Return a bool vector over the tokenizer's vocabulary: the legal next tokens."""
        start = time.perf_counter()
        self.matcher.unsafe_compute_mask_ptr(self._mask.ctypes.data, self._mask.nbytes)
        bits = np.unpackbits(self._mask.view(np.uint8), bitorder='little')
        self.mask_s += time.perf_counter() - start
        self.masks += 1
        return bits[:self.library.vocab_size].astype(bool)

    def mask(self, logits: np.ndarray) -> np.ndarray:
        """Return float32 logits with every illegal token at -inf (a copy)."""
        legal = self.legal()
        out = np.full(logits.shape[-1], -np.inf, dtype=np.float32)
        width = min(len(legal), logits.shape[-1])
        row = np.asarray(logits, dtype=np.float32)[:width]
        out[:width] = np.where(legal[:width], row, -np.inf)
        return out

    def accept(self, token: int) -> bool:
        """Take the token the goal streamed; return False if the grammar refuses it."""
        return bool(self.matcher.consume_token(int(token)))

    @property
    def complete(self) -> bool:
        """Tell whether the text so far is a whole answer (the grammar may stop here)."""
        return bool(self.matcher.is_accepting())

    @property
    def error(self) -> str:
        """Return what the matcher refused, or '' when it refused nothing."""
        return self.matcher.get_error() if self.matcher.is_error() else ''

    def closure(self, max_tokens: int = 64, time_limit_s: float = 0.1) -> list | None:
        """Return tokens that complete the structure from here, without the model.

        Depth-first over the legal tokens: a forced token first, else the closers (a
        quote, a bracket, the shortest values) in ``CLOSERS`` order, and where few tokens
        are legal (an enum, a key) the others after them, shortest text first; a token
        that completes the structure at once is taken first. The matcher is rolled back
        to where it was; None when nothing is found within ``max_tokens`` and
        ``time_limit_s``.
        """
        deadline = time.perf_counter() + time_limit_s
        path: list = []
        found = self._search(path, max_tokens, deadline)
        if path:
            self.matcher.rollback(len(path))
        return list(found) if found is not None else None

    def _search(self, path: list, depth_left: int, deadline: float):
        if self.complete:
            return tuple(path)
        if depth_left <= 0 or time.perf_counter() > deadline or self.matcher.is_error():
            return None
        candidates = self._candidates()
        for token in candidates:  # a token that completes the structure at once wins
            if self.matcher.consume_token(token):
                if self.complete:
                    path.append(token)  # consumed: the caller rolls the whole path back
                    return tuple(path)
                self.matcher.rollback(1)
        for token in candidates:
            if not self.matcher.consume_token(token):
                continue
            path.append(token)
            found = self._search(path, depth_left - 1, deadline)
            if found is not None:
                return found
            path.pop()
            self.matcher.rollback(1)
        return None

    def _candidates(self) -> list:
        """Return the tokens to try next, most promising first."""
        forced = self.matcher.compute_ff_tokens()
        if forced:
            return forced[:1]
        legal = self.legal()
        legal[list(self.library.eos_ids)] = False  # the closure ends on the structure
        closers = self.library._closers
        if np.count_nonzero(legal) > FEW_LEGAL:
            return [i for i in closers if legal[i]]
        legal_ids = np.flatnonzero(legal).tolist()
        rank = {token: index for index, token in enumerate(closers)}
        texts = self.library._texts
        return sorted(legal_ids, key=lambda i: (rank.get(i, len(rank)), len(texts[i]), i))


def _byte_level_json(tokenizer) -> str:
    """Return the tokenizer's JSON with a plain ByteLevel decoder when it is byte-level BPE.

    llguidance reads a token's bytes through the decoder. A GGUF tokenizer converted by
    transformers 5 wraps ByteLevel in a Sequence (ByteFallback, Fuse, Replace) that
    llguidance does not read as byte-level, so 'Ġ' would be taken as the letter, not a
    space. The model's own decoding is unchanged (this copy is llguidance's alone).
    """
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    decoder = spec.get('decoder') or {}
    parts = decoder.get('decoders', []) if decoder.get('type') == 'Sequence' else [decoder]
    byte_level = [part for part in parts if part.get('type') == 'ByteLevel']
    if byte_level and decoder.get('type') != 'ByteLevel':
        spec['decoder'] = byte_level[0]
    spec['padding'] = spec['truncation'] = None
    return json.dumps(spec)
