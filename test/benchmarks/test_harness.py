# SPDX-License-Identifier: Apache-2.0
"""The harness: nodes and their clients by name, tier budgets, new results folders."""

import pytest

from benchmarks import harness


def test_tier_budget_is_relative_to_the_full_time_or_absolute():
    assert harness.tier_budget('0.5x', 4.0) == 2.0
    assert harness.tier_budget('2s', 4.0) == 2.0


class FakeNode:
    def __init__(self, params, ready_timeout, namespace):
        self.params, self.namespace, self.stopped = params, namespace, False

    def stop(self):
        self.stopped = True


class FakeClient:
    def __init__(self, action, name, responses):
        self.action, self.name, self.responses, self.events = action, name, responses, []

    def wait_for_server(self, timeout):
        self.events.append('wait')

    def ask(self, goal, timeout):
        return (goal, timeout)

    def close(self):
        self.events.append('close')


def test_nodes_start_and_stop_by_name(monkeypatch):
    import timebill_ros.tools.client as client_module
    import timebill_ros.tools.process as process_module
    monkeypatch.setattr(process_module, 'NodeProcess', FakeNode)
    monkeypatch.setattr(client_module, 'InstructClient', FakeClient)
    nodes = harness.Nodes(lambda message: None)
    nodes.start_node('A', {'max_batch': 1}, '/bench_a', 'bench_client_A',
                     prepare=lambda client: client.events.append('prepare'))
    node, client = nodes.nodes['A'], nodes.clients['A']
    assert node.namespace == '/bench_a' and node.params == {'max_batch': 1}
    assert (client.action, client.name, client.responses) == (
        '/bench_a/timebill/instruct', 'bench_client_A', '/bench_a/timebill/responses')
    assert client.events == ['prepare', 'wait']  # subscriptions before the wait
    assert nodes.clients['A'].ask('goal', 5.0) == ('goal', 5.0)
    nodes.stop()
    assert client.events[-1] == 'close' and node.stopped


def test_runs_go_to_new_folders_and_never_overwrite(tmp_path, monkeypatch):
    monkeypatch.setattr(harness, 'RESULTS', tmp_path / 'results')
    fresh = harness.claim_out(None, 'burst')
    assert fresh.is_dir() and fresh.parent == tmp_path / 'results'
    assert fresh.name.startswith('burst-') and fresh.name.endswith('Z')
    with pytest.raises(SystemExit, match='never overwritten'):
        harness.claim_out(str(fresh), 'burst')
    # An unfinished run of a resumable benchmark continues; a finished one does not.
    (fresh / 'partial.json').write_text('[]')
    assert harness.claim_out(str(fresh), 'burst', resumable=True) == fresh
    (fresh / 'bench.json').write_text('{}')
    with pytest.raises(SystemExit):
        harness.claim_out(str(fresh), 'burst', resumable=True)
    stem = harness.claim_file(None, 'threads')
    assert stem.parent.is_dir() and stem.name == 'threads'
    stem.with_suffix('.json').write_text('{}')
    with pytest.raises(SystemExit):
        harness.claim_file(str(stem), 'threads')
