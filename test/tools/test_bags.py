# SPDX-License-Identifier: Apache-2.0
"""rosbag2 workloads through rosbags: round trips (sqlite3, MCAP) and clear errors for bad bags."""

from pathlib import Path
import shutil

import pytest
from rosbags.rosbag2 import StoragePlugin, Writer
from rosbags.typesys import get_types_from_msg, get_typestore, Stores

from timebill_ros.core.workload import make_workload, MODES, periodic_arrivals, \
    poisson_arrivals, POLICIES, WorkloadItem
from timebill_ros.tools import bags

ROOT = Path(__file__).resolve().parents[2]
START = 1_750_000_000_123_456_789
STORAGES = [('sqlite3', '.db3'), ('mcap', '.mcap')]
ITEMS = [
    WorkloadItem('a', 'Say hello.', 2.5, 0.0, mode=MODES['none'], max_new_tokens=8),
    WorkloadItem('b', 'Long one, with unicode: héllo ✓', 0.15, 0.25, context='ctx ' * 50,
                 policy=POLICIES['skip_next'], mode=MODES['eviction'], max_new_tokens=4000,
                 pessimistic_factor=1.5, eviction_ratio=0.5, expected_tokens=7,
                 token_deadline_s=0.25, precision='int8-weight'),
    WorkloadItem('c', '', 0.0, 0.25),
    WorkloadItem('d', 'Last.', 600.0, 3.1, policy=POLICIES['node_default']),
]


def data_file(bag):
    files = [p for p in bag.iterdir() if p.suffix in ('.db3', '.mcap')]
    assert len(files) == 1
    return files[0]


@pytest.mark.parametrize('storage, suffix', STORAGES)
def test_round_trip(tmp_path, storage, suffix):
    bag = bags.write_workload(tmp_path / 'w', ITEMS, storage=storage, start_ns=START)
    assert data_file(bag).suffix == suffix
    back = bags.read_workload(bag)
    assert back.start_ns == START and back.topic == bags.DEFAULT_TOPIC
    assert back.items == ITEMS
    assert [m.log_time_ns for m in back.messages] == [
        START + round(i.arrival_s * 1e9) for i in ITEMS]
    for message in back.messages:
        msg = bags.deserialize(message.raw, bags.INSTRUCTION)
        assert msg.header.stamp.sec * 10**9 + msg.header.stamp.nanosec == message.log_time_ns
    assert bags.bag_topics(bag) == {bags.DEFAULT_TOPIC: bags.INSTRUCTION}
    # The data file alone (no metadata.yaml) reads the same messages.
    alone = bags.read_messages(data_file(bag), bags.DEFAULT_TOPIC, bags.INSTRUCTION)
    assert [(t, raw) for t, _, raw in alone] == [(m.log_time_ns, m.raw) for m in back.messages]


def test_stored_bytes_are_what_rclpy_publishes(tmp_path):
    from rclpy.serialization import deserialize_message, serialize_message
    from timebill_msgs.msg import Instruction
    bag = bags.write_workload(tmp_path / 'w', ITEMS, start_ns=START)
    for message in bags.read_workload(bag).messages:
        msg = deserialize_message(message.raw, Instruction)
        assert bags.item_from_msg(msg, message.item.arrival_s) == message.item
        # And rclpy's bytes decode back in rosbags (padding bytes may differ, values not).
        again = bags.deserialize(bytes(serialize_message(msg)), bags.INSTRUCTION)
        assert bags.item_from_msg(again, message.item.arrival_s) == message.item


@pytest.mark.parametrize('storage, suffix', STORAGES)
def test_poisson_round_trip_keeps_the_first_gap(tmp_path, storage, suffix):
    items = make_workload(poisson_arrivals(6, 3.0, seed=4), [1.0, 2.0])
    bag = bags.write_workload(tmp_path / 'p', items, storage=storage, topic='/x/instructions')
    back = bags.read_workload(bag, '/x/instructions')
    assert [i.id for i in back.items] == [i.id for i in items]
    assert [i.arrival_s for i in back.items] == pytest.approx(
        [i.arrival_s for i in items], abs=1e-9)
    assert back.messages[0].log_time_ns - back.start_ns == round(items[0].arrival_s * 1e9)


def test_unsorted_items_are_written_in_arrival_order(tmp_path):
    bag = bags.write_workload(tmp_path / 'w', ITEMS[::-1], start_ns=START)
    # b and c arrive together: a stable sort keeps their given order.
    assert [i.id for i in bags.read_workload(bag).items] == ['a', 'c', 'b', 'd']


def test_foreign_bag_arrivals_count_from_the_first_message(tmp_path):
    # No recorded start (as from `ros2 bag record`): offsets count from the first message.
    records = [(bags.DEFAULT_TOPIC, START + 5 * 10**8 * k,
                bags.serialize(bags.instruction_msg(item, START), bags.INSTRUCTION))
               for k, item in enumerate(ITEMS)]
    bag = bags.write_bag(tmp_path / 'f', {bags.DEFAULT_TOPIC: bags.INSTRUCTION}, records)
    back = bags.read_workload(bag)
    assert back.start_ns == START
    assert [i.arrival_s for i in back.items] == [0.0, 0.5, 1.0, 1.5]


def test_write_refuses_existing_path_unknown_storage_and_duplicate_ids(tmp_path):
    bags.write_workload(tmp_path / 'w', ITEMS)
    with pytest.raises(bags.BagExistsError, match='exists already'):
        bags.write_workload(tmp_path / 'w', ITEMS)
    with pytest.raises(ValueError, match='unknown bag storage'):
        bags.write_workload(tmp_path / 'x', ITEMS, storage='rosbag1')
    with pytest.raises(ValueError, match='duplicate request id'):
        bags.write_workload(tmp_path / 'y', ITEMS + ITEMS[:1])


# -- bad bags -----------------------------------------------------------------------------

def test_nonexistent_path(tmp_path):
    with pytest.raises(bags.BagNotFoundError, match='does not exist'):
        bags.read_workload(tmp_path / 'nope')


@pytest.mark.parametrize('storage, suffix', STORAGES)
def test_missing_topic(tmp_path, storage, suffix):
    bag = bags.write_workload(tmp_path / 'w', ITEMS, topic='/other', storage=storage)
    with pytest.raises(bags.BagTopicError,
                       match=r'has no topic /timebill/instructions \(topics: /other\)'):
        bags.read_workload(bag)


@pytest.mark.parametrize('storage, suffix', STORAGES)
def test_wrong_message_type(tmp_path, storage, suffix):
    store = bags.typestore()
    string = store.types['std_msgs/msg/String']
    raw = bytes(store.serialize_cdr(string(data='hi'), 'std_msgs/msg/String'))
    bag = bags.write_bag(tmp_path / 's', {bags.DEFAULT_TOPIC: 'std_msgs/msg/String'},
                         [(bags.DEFAULT_TOPIC, START, raw)], storage)
    with pytest.raises(bags.BagTypeError,
                       match='carries std_msgs/msg/String, not timebill_msgs/msg/Instruction'):
        bags.read_workload(bag)


# The Instruction as recorded before the goal's planning fields were appended to it.
EARLIER = '''std_msgs/Header header
string id
string instruction
string context
builtin_interfaces/Duration budget
uint8 overrun_policy
uint8 mode
uint32 max_new_tokens
float32 pessimistic_factor
'''


def _bag_of_definition(path, definition, fields):
    """Write one Instruction of another definition (own typestore) and return the bag."""
    store = get_typestore(Stores.ROS2_KILTED)
    store.register(get_types_from_msg(definition, bags.INSTRUCTION))
    cls = store.types[bags.INSTRUCTION]
    header = store.types['std_msgs/msg/Header'](
        stamp=store.types['builtin_interfaces/msg/Time'](sec=START // 10**9,
                                                         nanosec=START % 10**9),
        frame_id='')
    msg = cls(header=header, **fields)
    with Writer(path, version=9, storage_plugin=StoragePlugin.SQLITE3) as writer:
        conn = writer.add_connection(bags.DEFAULT_TOPIC, bags.INSTRUCTION, typestore=store)
        writer.write(conn, START, bytes(store.serialize_cdr(msg, bags.INSTRUCTION)))
    return path


def test_a_bag_of_the_earlier_instruction_reads_and_replays_as_todays(tmp_path):
    from rclpy.serialization import deserialize_message
    from timebill_msgs.msg import Instruction
    duration = get_typestore(Stores.ROS2_KILTED).types['builtin_interfaces/msg/Duration']
    bag = _bag_of_definition(tmp_path / 'old', EARLIER, dict(
        id='a', instruction='Say hello.', context='', budget=duration(sec=2, nanosec=500000000),
        overrun_policy=2, mode=2, max_new_tokens=8, pessimistic_factor=1.5))
    back = bags.read_workload(bag)
    assert back.items == [WorkloadItem('a', 'Say hello.', 2.5, 0.0, policy=2, mode=2,
                                       max_new_tokens=8, pessimistic_factor=1.5)]
    # Replay publishes the bytes as they are: re-encoded in today's definition.
    msg = deserialize_message(back.messages[0].raw, Instruction)
    assert bags.item_from_msg(msg, 0.0) == back.items[0] and msg.precision == ''
    assert msg.header.stamp.sec * 10**9 + msg.header.stamp.nanosec == START
    # A bag this package recorded before the change (committed in results/) reads too.
    committed = bags.read_workload(ROOT / 'results/sched/runs/edf+batch4-burst-0.8/workload_bag')
    assert len(committed.items) == 20
    assert all(i.precision == '' and i.eviction_ratio == 0.0 for i in committed.items)


LEGACY = 'timebill_ros/msg/Instruction'


@pytest.mark.parametrize('storage, suffix', STORAGES)
def test_a_bag_of_the_legacy_type_name_reads_as_todays(tmp_path, storage, suffix):
    # Before timebill_msgs, timebill_ros generated the messages: same definition, old name.
    store = bags.typestore()
    assert bags.legacy_names(bags.INSTRUCTION) == (LEGACY,)
    assert bags.legacy_names('std_msgs/msg/String') == ()
    records = [(bags.DEFAULT_TOPIC, START + round(item.arrival_s * 1e9),
                bytes(store.serialize_cdr(bags.instruction_msg(item, START), LEGACY)))
               for item in ITEMS]
    bag = bags.write_bag(tmp_path / 'legacy', {bags.DEFAULT_TOPIC: LEGACY}, records, storage)
    assert bags.bag_topics(bag) == {bags.DEFAULT_TOPIC: LEGACY}
    back = bags.read_workload(bag)
    assert back.items == ITEMS
    # Replay publishes today's type: the bytes are re-encoded (same values, same layout).
    for message, (_, _, raw) in zip(back.messages, records):
        assert bags.item_from_msg(bags.deserialize(message.raw, bags.INSTRUCTION),
                                  message.item.arrival_s) == message.item
        assert message.raw == raw


def test_a_committed_replay_bag_of_the_legacy_names_reads():
    # results/ holds bags recorded before timebill_msgs: Responses and telemetry read too.
    bag = ROOT / 'results/sched/runs/edf-burst-0.8/replay_bag'
    if not bag.is_dir():
        pytest.skip(f'{bag} is not in this checkout')
    topics = bags.bag_topics(bag)
    assert topics['/sched/timebill/responses'] == 'timebill_ros/msg/Response'
    responses = bags.read_messages(bag, '/sched/timebill/responses', bags.RESPONSE)
    telemetry = bags.read_messages(bag, '/sched/timebill/telemetry', bags.TELEMETRY)
    assert len(responses) == 20 and len(telemetry) == 13
    assert all(msg.id for _, msg, _ in responses)


def test_another_definition_of_the_type(tmp_path):
    # Same type name, fields that differ from ours (not a prefix): decoding would misread.
    other = EARLIER.replace('builtin_interfaces/Duration budget', 'float64 budget')
    bag = _bag_of_definition(tmp_path / 'other', other, dict(
        id='a', instruction='Say hello.', context='', budget=2.5, overrun_policy=0, mode=0,
        max_new_tokens=8, pessimistic_factor=0.0))
    with pytest.raises(bags.BagTypeError, match='another definition'):
        bags.read_workload(bag)


def test_undecodable_message(tmp_path):
    bag = bags.write_bag(tmp_path / 'g', {bags.DEFAULT_TOPIC: bags.INSTRUCTION},
                         [(bags.DEFAULT_TOPIC, START, b'\x00\x01\x00\x00\xff\xff\xff\x7f')])
    with pytest.raises(bags.BagFormatError, match='message 0 on /timebill/instructions is '
                                                  'not a valid timebill_msgs/msg/Instruction'):
        bags.read_workload(bag)


@pytest.mark.parametrize('storage, suffix', STORAGES)
@pytest.mark.parametrize('keep', [0.0, 0.5, 0.9])
def test_truncated_file(tmp_path, storage, suffix, keep):
    items = make_workload(periodic_arrivals(20, 0.1), 1.0, context='x' * 2000)
    bag = bags.write_workload(tmp_path / 'w', items, storage=storage)
    path = data_file(bag)
    with path.open('r+b') as stream:
        stream.truncate(int(path.stat().st_size * keep))
    with pytest.raises(bags.BagFormatError, match='corrupt or truncated'):
        bags.read_workload(bag)


def test_not_a_bag(tmp_path):
    (tmp_path / 'dir').mkdir()
    with pytest.raises(bags.BagFormatError, match='no metadata.yaml'):
        bags.read_workload(tmp_path / 'dir')
    (tmp_path / 'notes.txt').write_text('hello')
    with pytest.raises(bags.BagFormatError, match='expected a bag directory'):
        bags.read_workload(tmp_path / 'notes.txt')
    (tmp_path / 'fake.db3').write_bytes(b'not sqlite at all' * 100)
    with pytest.raises(bags.BagFormatError, match='corrupt or truncated'):
        bags.read_workload(tmp_path / 'fake.db3')
    (tmp_path / 'fake.mcap').write_bytes(b'\x89MCAP0\r\n' + b'\x00' * 40)
    with pytest.raises(bags.BagFormatError, match='corrupt or truncated'):
        bags.read_workload(tmp_path / 'fake.mcap')


def test_missing_data_file_and_bad_metadata(tmp_path):
    bag = bags.write_workload(tmp_path / 'w', ITEMS)
    broken = tmp_path / 'broken'
    shutil.copytree(bag, broken)
    data_file(broken).unlink()
    with pytest.raises(bags.BagFormatError, match='missing'):
        bags.read_workload(broken)
    (bag / 'metadata.yaml').write_text('rosbag2_bagfile_information: {version: 9}\n')
    with pytest.raises(bags.BagFormatError, match='corrupt or truncated'):
        bags.read_workload(bag)


def test_errors_share_one_base_class():
    for cls in (bags.BagNotFoundError, bags.BagFormatError, bags.BagTopicError,
                bags.BagTypeError, bags.BagExistsError):
        assert issubclass(cls, bags.BagError)
