# SPDX-License-Identifier: Apache-2.0
"""llguidance, xgrammar and llama.cpp's GBNF on this CPU: compile, mask per token, correctness.

``python -m benchmarks.bench_grammar --out results/grammar/<run>`` compiles the
schema of every dev item of the structured-output workload (evaluation.schema_commands)
with each library for the node's tokenizer (cold, then cached), walks each item's
reference answer token by token computing the mask before each token (the cost a goal
pays per decode step), and checks correctness: every reference token legal and the
answer complete at its end, and a wrong answer (an enum value outside the schema)
refused. xgrammar is optional (``pip install xgrammar``; it pulls triton): without it it is
left out. llama.cpp's own grammar sampler (``LlamaCppGbnf``) is the fallback compared
against. Writes bench.json and README.md (command, commit, date, CPU).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import statistics
import sys
import time

import numpy as np

from benchmarks.common import commit, machine, stamped_log
from benchmarks.harness import new_results_dir
from timebill_ros.evaluation.schema_commands import schema_commands, split


def reference_text(item) -> str:
    """Return the item's reference as the model would write it (schema key order)."""
    value = dict(item.reference)
    for key, spec in item.schema['properties'].items():
        if key not in value:
            value[key] = 'ok' if spec.get('type') == 'string' else None
    return json.dumps({key: value[key] for key in item.schema['properties']})


def wrong_text(item) -> str:
    """Return an answer the schema must refuse (a key it does not have)."""
    return '{"unknown_key": 1}'


class Llguidance:
    """The node's path: runtime.grammar on llguidance."""

    name = 'llguidance'

    def __init__(self, tokenizer, eos_ids):
        from timebill_ros.runtime.grammar import GrammarLibrary
        self.library = GrammarLibrary(tokenizer, eos_ids)

    def compile(self, schema: str):
        return self.library.compile(schema)

    def walk(self, compiled, ids) -> tuple:
        """Return (mask seconds per token, all legal, complete at the end)."""
        constraint, times, legal = self.library.constraint(compiled), [], True
        for token in ids:
            start = time.perf_counter()
            mask = constraint.legal()
            times.append(time.perf_counter() - start)
            legal = legal and bool(mask[token]) and constraint.accept(token)
        return times, legal, constraint.complete


class Xgrammar:
    """xgrammar 0.2's GrammarMatcher with its CPU bitmask."""

    name = 'xgrammar'

    def __init__(self, tokenizer, eos_ids):
        import xgrammar
        self.xgr = xgrammar
        info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=len(tokenizer),
                                                       stop_token_ids=sorted(eos_ids))
        self.compiler = xgrammar.GrammarCompiler(info, cache_enabled=True)
        self.vocab = len(tokenizer)

    def compile(self, schema: str):
        return self.compiler.compile_json_schema(schema, any_whitespace=False,
                                                 separators=(', ', ': '))

    def walk(self, compiled, ids) -> tuple:
        matcher = self.xgr.GrammarMatcher(compiled)
        bitmask = self.xgr.allocate_token_bitmask(1, self.vocab)
        times, legal = [], True
        for token in ids:
            start = time.perf_counter()
            matcher.fill_next_token_bitmask(bitmask)
            bits = np.unpackbits(bitmask.numpy().view(np.uint8), bitorder='little')
            times.append(time.perf_counter() - start)
            legal = legal and bool(bits[token]) and matcher.accept_token(token)
        return times, legal, matcher.is_terminated() or matcher.is_completed()


class LlamaCppGbnf:
    """llama.cpp's own grammar sampler (llama_ros's path): the schema as GBNF, one sampler.

    The schema is converted by llama-cpp-python's ``json_schema_to_gbnf`` (its grammar
    allows free whitespace: the node's spacing is one of its choices); llama.cpp parses
    it when the sampler is made. The mask is ``llama_sampler_apply`` over a row of the
    whole vocabulary (illegal tokens to -inf), on the embedded GGUF's own vocabulary.
    """

    name = 'llama.cpp GBNF'

    def __init__(self, tokenizer, eos_ids):
        from llama_cpp.llama_grammar import json_schema_to_gbnf
        from timebill_ros.runtime.llama_engine import _llama
        from timebill_ros.runtime.model import embedded_gguf
        api = self.api = _llama()
        params = api.llama_model_default_params()
        params.vocab_only = True
        self._model = api.llama_model_load_from_file(str(embedded_gguf()).encode(), params)
        self.vocab = api.llama_model_get_vocab(self._model)
        size = api.llama_vocab_n_tokens(self.vocab)
        self.row = np.zeros(size, dtype=[('id', '<i4'), ('logit', '<f4'), ('p', '<f4')])
        self.row['id'] = np.arange(size)
        self.candidates = api.llama_token_data_array(
            data=ctypes.cast(self.row.ctypes.data, api.llama_token_data_p), size=size,
            selected=-1, sorted=False)
        self.eos = sorted(eos_ids)[0]
        self.to_gbnf = json_schema_to_gbnf

    def _sampler(self, gbnf: bytes):
        sampler = self.api.llama_sampler_init_grammar(self.vocab, gbnf, b'root')
        if not sampler:
            raise ValueError('llama.cpp did not parse the grammar')
        return sampler

    def compile(self, schema: str) -> bytes:
        gbnf = self.to_gbnf(schema).encode()
        self.api.llama_sampler_free(self._sampler(gbnf))  # llama.cpp parses it here
        return gbnf

    def _legal(self, sampler) -> np.ndarray:
        self.row['logit'] = 0.0
        self.candidates.size, self.candidates.selected = len(self.row), -1
        self.api.llama_sampler_apply(sampler, ctypes.byref(self.candidates))
        return np.isfinite(self.row['logit'])

    def walk(self, compiled, ids) -> tuple:
        """Return (mask seconds per token, all legal, complete at the end).

        An illegal token is never accepted: llama.cpp's grammar throws on one.
        """
        sampler, times, legal = self._sampler(compiled), [], True
        try:
            for token in ids:
                start = time.perf_counter()
                mask = self._legal(sampler)
                times.append(time.perf_counter() - start)
                if not mask[token]:
                    return times, False, False
                self.api.llama_sampler_accept(sampler, token)
            return times, legal, bool(self._legal(sampler)[self.eos])
        finally:
            self.api.llama_sampler_free(sampler)


def measure(library, items, tokenizer) -> dict:
    """Return compile and mask times and correctness of one library over ``items``."""
    cold, warm, masks, legal, refused = [], [], [], 0, 0
    for item in items:
        text = item.schema_text
        start = time.perf_counter()
        compiled = library.compile(text)
        cold.append(time.perf_counter() - start)
        start = time.perf_counter()
        library.compile(text)
        warm.append(time.perf_counter() - start)
        ids = tokenizer(reference_text(item), add_special_tokens=False)['input_ids']
        times, all_legal, complete = library.walk(compiled, ids)
        masks += times
        legal += all_legal and complete
        bad = tokenizer(wrong_text(item), add_special_tokens=False)['input_ids']
        refused += not library.walk(compiled, bad)[1]
    return {'items': len(items), 'compile_cold_ms_median': 1e3 * statistics.median(cold),
            'compile_cold_ms_max': 1e3 * max(cold),
            'compile_cached_ms_median': 1e3 * statistics.median(warm),
            'mask_ms_median': 1e3 * statistics.median(masks),
            'mask_ms_p99': 1e3 * float(np.percentile(masks, 99)),
            'mask_ms_max': 1e3 * max(masks), 'masks': len(masks),
            'reference_accepted': legal, 'wrong_refused': refused}


def chooser_cost(tokenizer, eos_ids, items, vocab: int) -> dict:
    """Return ms per token the node's TokenChooser adds over a plain argmax (mask and pick).

    Each item's reference tokens are fed as if a lane had produced random logits rows of
    the model's width; the chooser masks and picks, then takes the reference token.
    """
    import torch
    from timebill_ros.core.output import OutputSpec
    from timebill_ros.runtime.choosing import TokenChooser
    from timebill_ros.runtime.grammar import GrammarLibrary
    library = GrammarLibrary(tokenizer, eos_ids)
    rows = torch.randn(64, vocab)
    plain, chosen = [], []
    for item in items:
        chooser = TokenChooser(OutputSpec(json_schema=item.schema_text),
                               library.constraint(library.compile(item.schema_text)))
        for index, token in enumerate(tokenizer(reference_text(item),
                                                add_special_tokens=False)['input_ids']):
            row = rows[index % len(rows)]
            start = time.perf_counter()
            int(row.argmax())
            plain.append(time.perf_counter() - start)
            start = time.perf_counter()
            chooser.choose(row)
            chosen.append(time.perf_counter() - start)
            chooser.accept(token, '')
    return {'argmax_ms_median': 1e3 * statistics.median(plain),
            'chooser_ms_median': 1e3 * statistics.median(chosen),
            'chooser_ms_p99': 1e3 * float(np.percentile(chosen, 99)), 'tokens': len(chosen)}


def main(argv=None) -> int:
    """Measure both libraries and write the results folder."""
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--out', required=True, help='a new results folder')
    args = parser.parse_args(argv)
    out = new_results_dir(args.out)
    if out is None:
        return 2
    from timebill_ros.runtime.model import load_model
    log = stamped_log()
    loaded = load_model('embedded')
    dev, _ = split(schema_commands())
    rows = {}
    for kind in (Llguidance, Xgrammar, LlamaCppGbnf):
        try:
            start = time.perf_counter()
            library = kind(loaded.tokenizer, loaded.eos_ids)
            setup = time.perf_counter() - start
        except ImportError as exc:
            log(f'{kind.name}: not installed ({exc})')
            continue
        rows[kind.name] = {'setup_s': setup, **measure(library, dev, loaded.tokenizer)}
        log(f'{kind.name}: {rows[kind.name]}')
    cost = chooser_cost(loaded.tokenizer, loaded.eos_ids, dev, loaded.model.config.vocab_size)
    log(f'chooser: {cost}')
    out.mkdir(parents=True)
    info = {'command': ' '.join(['python -m benchmarks.bench_grammar'] + sys.argv[1:]),
            'chooser': cost,
            'date': datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'),
            'commit': commit(), 'machine': machine(), 'rows': rows}
    (out / 'bench.json').write_text(json.dumps(info, indent=2))
    lines = [f'# Grammar libraries on this CPU, {info["date"][:10]}', '',
             f'Command: `{info["command"]}` (commit {info["commit"]}); machine: '
             f'{info["machine"]}.', '',
             '| library | setup s | compile ms (median / max) | cached ms | mask ms '
             '(median / p99 / max) | reference accepted | wrong refused |',
             '|---|---|---|---|---|---|---|']
    for name, row in rows.items():
        lines.append(
            f'| {name} | {row["setup_s"]:.2f} | {row["compile_cold_ms_median"]:.2f} / '
            f'{row["compile_cold_ms_max"]:.2f} | {row["compile_cached_ms_median"]:.3f} | '
            f'{row["mask_ms_median"]:.3f} / {row["mask_ms_p99"]:.3f} / {row["mask_ms_max"]:.3f}'
            f' | {row["reference_accepted"]} / {row["items"]} | {row["wrong_refused"]} / '
            f'{row["items"]} |')
    lines += ['', f'The node\'s whole choice per token (runtime.choosing.TokenChooser: logits to '
              f'numpy, llguidance mask, argmax) over {cost["tokens"]} reference tokens: '
              f'{cost["chooser_ms_median"]:.3f} ms median, {cost["chooser_ms_p99"]:.3f} ms p99, '
              f'against {cost["argmax_ms_median"]:.3f} ms for the plain argmax of free text.']
    (out / 'README.md').write_text('\n'.join(lines) + '\n')
    print('\n'.join(lines))
    return 0


if __name__ == '__main__':
    sys.exit(main())
