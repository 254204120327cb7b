# SPDX-License-Identifier: Apache-2.0
"""timebill_bag command line: write/show/report, one-line errors with exit status 2."""

import subprocess
import sys

import pytest

from conftest import ROOT
from test_report import KNOWN_CSV
from timebill_ros.cli.bag import main
from timebill_ros.tools import bags


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_help_runs_as_a_module():
    proc = subprocess.run([sys.executable, '-m', 'timebill_ros.cli.bag', '--help'], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    for command in ('write', 'show', 'replay', 'report'):
        assert command in proc.stdout


@pytest.mark.parametrize('storage', ['sqlite3', 'mcap'])
def test_write_then_show(capsys, tmp_path, storage):
    code, out, err = run(capsys, 'write', str(tmp_path / 'w'), '--pattern', 'burst',
                         '--count', '5', '--burst-size', '2', '--period', '1.5',
                         '--budget', '1', '4', '--instruction', 'one', '--instruction', 'two',
                         '--mode', 'none', '--policy', 'skip_next', '--max-new-tokens', '16',
                         '--storage', storage)
    assert code == 0 and 'wrote' in out and '5 instructions' in out, err
    items = bags.read_workload(tmp_path / 'w').items
    assert [i.arrival_s for i in items] == [0.0, 0.0, 1.5, 1.5, 3.0]
    assert [i.instruction for i in items] == ['one', 'two', 'one', 'two', 'one']
    assert [i.budget_s for i in items] == [1.0, 4.0, 1.0, 4.0, 1.0]
    # MODE_NONE (1), SKIP_NEXT (2), 16 tokens.
    assert {(i.mode, i.policy, i.max_new_tokens) for i in items} == {(1, 2, 16)}
    assert {(i.eviction_ratio, i.precision) for i in items} == {(0.0, '')}
    code, out, _ = run(capsys, 'show', str(tmp_path / 'w'))
    assert code == 0 and out.count('req-') == 5 and 'precision' not in out


def test_write_carries_the_goals_planning_fields(capsys, tmp_path):
    code, _, err = run(capsys, 'write', str(tmp_path / 'w'), '--pattern', 'periodic',
                       '--count', '2', '--period', '1', '--budget', '3', '--mode', 'eviction',
                       '--eviction-ratio', '0.5', '--expected-tokens', '12',
                       '--token-deadline', '0.25', '--precision', 'int8-weight')
    assert code == 0, err
    items = bags.read_workload(tmp_path / 'w').items
    assert {(i.eviction_ratio, i.expected_tokens, i.token_deadline_s, i.precision)
            for i in items} == {(0.5, 12, 0.25, 'int8-weight')}
    code, out, _ = run(capsys, 'show', str(tmp_path / 'w'))
    assert code == 0 and out.count('precision int8-weight') == 2
    assert 'eviction_ratio 0.5' in out and 'token_deadline 0.25' in out


def test_write_carries_the_answer_form(capsys, tmp_path):
    schema = tmp_path / 'lane.schema.json'
    schema.write_text('{"type": "object", "properties": {"lane": {"enum": ["left", "right"]}}}')
    code, _, err = run(capsys, 'write', str(tmp_path / 'w'), '--pattern', 'periodic',
                       '--count', '2', '--period', '1', '--budget', '3',
                       '--system-prompt', 'You drive.', '--json-schema-file', str(schema))
    assert code == 0, err
    items = bags.read_workload(tmp_path / 'w').items
    assert {(i.system_prompt, i.json_schema, i.grammar) for i in items} == \
        {('You drive.', schema.read_text(), '')}
    code, out, _ = run(capsys, 'show', str(tmp_path / 'w'))
    assert code == 0 and out.count('json_schema yes') == 2


def test_poisson_with_builtin_instructions(capsys, tmp_path):
    code, _, err = run(capsys, 'write', str(tmp_path / 'p'), '--pattern', 'poisson',
                       '--rate', '5', '--seed', '1', '--count', '8', '--budget', '2')
    assert code == 0, err
    items = bags.read_workload(tmp_path / 'p').items
    assert len(items) == 8 and len({i.instruction for i in items}) > 1


def test_report_renders_a_png(capsys, tmp_path):
    csv = tmp_path / 'r.csv'
    csv.write_text(KNOWN_CSV)
    code, out, err = run(capsys, 'report', str(csv), '--out', str(tmp_path / 'r.png'))
    assert code == 0 and 'r.png' in out, err
    assert (tmp_path / 'r.png').read_bytes()[:4] == b'\x89PNG'


@pytest.mark.parametrize('argv, message', [
    (['write', '{tmp}/w', '--budget', '1'], '--pattern periodic needs --period'),
    (['write', '{tmp}/w', '--pattern', 'poisson', '--budget', '1'], 'needs --rate'),
    (['write', '{tmp}/w', '--period', '0', '--budget', '1'], 'period_s must be > 0'),
    (['write', '{tmp}/w', '--period', '1', '--budget', 'nan'], 'budget_s must be finite'),
    (['write', '{tmp}/w', '--period', '1', '--budget', '1', '--context-file', '{tmp}/none'],
     'No such file'),
    (['show', '{tmp}/nope'], 'does not exist'),
    (['show', '{tmp}'], 'no metadata.yaml'),
    (['report', '{tmp}/nope.csv'], 'cannot read'),
    (['replay', '{tmp}/nope'], 'does not exist'),
])
def test_errors_are_one_line_and_exit_2(capsys, tmp_path, argv, message):
    code, _, err = run(capsys, *[a.format(tmp=tmp_path) for a in argv])
    assert code == 2
    assert err.count('\n') == 1 and message in err and err.startswith('timebill_bag ')


def test_existing_output_is_refused(capsys, tmp_path):
    args = ['write', str(tmp_path / 'w'), '--period', '1', '--budget', '1', '--count', '2']
    assert run(capsys, *args)[0] == 0
    code, _, err = run(capsys, *args)
    assert code == 2 and 'exists already' in err


def test_usage_errors_are_one_line_and_exit_2(capsys):
    with pytest.raises(SystemExit) as exc:
        main(['write'])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count('\n') == 1 and 'error:' in err


def test_replay_without_a_node(capsys, tmp_path):
    assert run(capsys, 'write', str(tmp_path / 'w'), '--period', '1', '--budget', '1',
               '--count', '1')[0] == 0
    code, _, err = run(capsys, 'replay', str(tmp_path / 'w'), '--node', '/nobody_here',
                       '--discovery-timeout', '0.3', '--out', str(tmp_path / 'out'))
    assert code == 2 and 'no timebill node found' in err and err.count('\n') == 1
