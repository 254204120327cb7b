# SPDX-License-Identifier: Apache-2.0
"""rosbag2 files of Instructions, Responses and telemetry, through the pure-Python rosbags.

No rclpy here: the message types come from timebill_msgs' ``.msg`` files (the
installed share directory, else the repository's ``timebill_msgs/msg/``), registered
in a rosbags typestore on top of the ROS 2 Kilted base types. Bags are written as
rosbag2 format version 9, sqlite3 (default) or MCAP, so ``ros2 bag play`` and
``ros2 bag info`` on a ROS 2 install read them.

Every failure to read a bag is a ``BagError`` subclass with a message that
names the bag: ``BagNotFoundError``, ``BagFormatError`` (not a bag, truncated,
corrupt, undecodable), ``BagTopicError`` (topic absent), ``BagTypeError``
(topic of another message type or definition). An Instruction recorded before
fields were appended to it reads with its own definition; the new fields are 0 / ''.
A bag recorded before the interfaces moved to timebill_msgs names its types
``timebill_ros/msg/...`` (LEGACY_PACKAGES): it reads as the same messages.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
import functools
import math
import os
from pathlib import Path
import time
from typing import Iterable, Iterator, Sequence

from rosbags.interfaces import (
    Qos, QosDurability, QosHistory, QosLiveliness, QosReliability, QosTime)
from rosbags.rosbag2 import Reader, StoragePlugin, Writer, WriterError
from rosbags.typesys import get_types_from_msg, get_typestore, Stores

from timebill_ros.core.workload import check_workload, WorkloadItem

PACKAGE = 'timebill_msgs'
# Packages that generated these messages before timebill_msgs did (timebill_ros up to
# 0.2.0): bags recorded then carry e.g. timebill_ros/msg/Instruction, the same definition.
LEGACY_PACKAGES = ('timebill_ros',)
INSTRUCTION = 'timebill_msgs/msg/Instruction'
RESPONSE = 'timebill_msgs/msg/Response'
TELEMETRY = 'timebill_msgs/msg/DeadlineTelemetry'
DEFAULT_NODE = '/timebill'
DEFAULT_TOPIC = DEFAULT_NODE + '/instructions'
STORAGES = {'sqlite3': StoragePlugin.SQLITE3, 'mcap': StoragePlugin.MCAP}
BAG_FILE_SUFFIXES = ('.db3', '.mcap')
# Metadata key holding the workload's time zero, so arrival offsets survive a
# first request that does not arrive at offset 0 (e.g. Poisson).
START_KEY = 'timebill_workload_start_ns'
# What the node's publishers and its ~/instructions subscription use; `ros2 bag play`
# publishes with the offered profile recorded in the bag. Zero times mean "default".
QOS = Qos(history=QosHistory.KEEP_LAST, depth=10, reliability=QosReliability.RELIABLE,
          durability=QosDurability.VOLATILE, deadline=QosTime(0, 0), lifespan=QosTime(0, 0),
          liveliness=QosLiveliness.AUTOMATIC, liveliness_lease_duration=QosTime(0, 0),
          avoid_ros_namespace_conventions=False)


class BagError(Exception):
    """A bag cannot be read or written as asked."""


class BagNotFoundError(BagError):
    """The bag path does not exist."""


class BagExistsError(BagError):
    """The output bag path exists already (rosbag2 writers never overwrite)."""


class BagFormatError(BagError):
    """The path is not a readable rosbag2 bag (not a bag, truncated, corrupt)."""


class BagTopicError(BagError):
    """The bag has no such topic."""


class BagTypeError(BagError):
    """The topic carries another message type, or another definition of it."""


@dataclass(frozen=True)
class BagInstruction:
    """One Instruction read from a bag: log time, the request, the stored CDR bytes."""

    log_time_ns: int
    item: WorkloadItem
    raw: bytes


@dataclass(frozen=True)
class WorkloadBag:
    """The Instructions of one topic of a bag, in log-time order."""

    path: Path
    topic: str
    # Time zero of the arrival offsets (wall-clock ns).
    start_ns: int
    messages: list

    @property
    def items(self) -> list:
        """Return the workload items in log-time order."""
        return [m.item for m in self.messages]


def msg_dir() -> Path:
    """Return the directory of this package's ``.msg`` files.

    The installed share directory (what the node was built from) comes first,
    then the source tree's ``msg/``.
    """
    candidates = [Path(prefix) / 'share' / PACKAGE / 'msg'
                  for prefix in os.environ.get('AMENT_PREFIX_PATH', '').split(os.pathsep)
                  if prefix]
    candidates.append(Path(__file__).resolve().parents[2] / PACKAGE / 'msg')
    for candidate in candidates:
        if (candidate / 'Instruction.msg').is_file():
            return candidate
    raise BagError(f'cannot find the {PACKAGE} .msg files (looked in '
                   + ', '.join(str(c) for c in candidates) + ')')


@functools.lru_cache(maxsize=None)
def typestore():
    """Return the ROS 2 Kilted typestore with the timebill_msgs messages registered.

    They are registered under their legacy names too (``timebill_ros/msg/...``), so a
    bag recorded before timebill_msgs existed decodes and its definitions compare.
    """
    store = get_typestore(Stores.ROS2_KILTED)
    types = {}
    for path in sorted(msg_dir().glob('*.msg')):
        for package in (PACKAGE, *LEGACY_PACKAGES):
            types.update(get_types_from_msg(path.read_text(), f'{package}/msg/{path.stem}'))
    store.register(types)
    return store


def legacy_names(msgtype: str) -> tuple:
    """Return the names a bag recorded before timebill_msgs gives ``msgtype`` (may be none)."""
    package, sep, rest = msgtype.partition('/')
    return tuple(f'{old}/{rest}' for old in LEGACY_PACKAGES) if sep and package == PACKAGE \
        else ()


def storage_plugin(storage: str) -> StoragePlugin:
    """Return the rosbags storage plugin for ``sqlite3`` or ``mcap``."""
    try:
        return STORAGES[storage]
    except KeyError:
        raise ValueError(f'unknown bag storage {storage!r} (expected one of '
                         f'{", ".join(STORAGES)})') from None


# -- message conversion -------------------------------------------------------------------

def _time(store, ns: int):
    sec, nanosec = divmod(int(ns), 1_000_000_000)
    return store.types['builtin_interfaces/msg/Time'](sec=sec, nanosec=nanosec)


def _duration(store, seconds: float):
    sec = math.floor(seconds)
    nanosec = int(round((seconds - sec) * 1e9))
    if nanosec >= 1_000_000_000:
        sec, nanosec = sec + 1, nanosec - 1_000_000_000
    return store.types['builtin_interfaces/msg/Duration'](sec=int(sec), nanosec=nanosec)


def instruction_msg(item: WorkloadItem, stamp_ns: int):
    """Return ``item`` as a rosbags Instruction message stamped ``stamp_ns``."""
    store = typestore()
    header = store.types['std_msgs/msg/Header'](stamp=_time(store, stamp_ns), frame_id='')
    return store.types[INSTRUCTION](
        header=header, id=item.id, instruction=item.instruction, context=item.context,
        budget=_duration(store, item.budget_s), overrun_policy=item.policy, mode=item.mode,
        max_new_tokens=item.max_new_tokens, pessimistic_factor=item.pessimistic_factor,
        eviction_ratio=item.eviction_ratio, expected_tokens=item.expected_tokens,
        token_deadline=_duration(store, item.token_deadline_s), precision=item.precision,
        # The answer's form: a system prompt and a schema or grammar (greedy, no history).
        system_prompt=item.system_prompt, history=[], stop=[], temperature=0.0, top_p=0.0,
        seed=0, json_schema=item.json_schema, grammar=item.grammar, deadline=_time(store, 0))


def _ns(stamp) -> int:
    """Return a Time or Duration message (rosbags or rclpy) in integer nanoseconds."""
    return int(stamp.sec) * 1_000_000_000 + int(stamp.nanosec)


def _seconds(duration) -> float:
    # Integer ns / 1e9 is correctly rounded: 0.15 s reads back as 0.15.
    return _ns(duration) / 1e9


def item_from_msg(msg, arrival_s: float) -> WorkloadItem:
    """Return the WorkloadItem of an Instruction message (rosbags or rclpy) at ``arrival_s``."""
    deadline = getattr(msg, 'token_deadline', None)
    return WorkloadItem(
        id=msg.id, instruction=msg.instruction, context=msg.context,
        budget_s=_seconds(msg.budget), arrival_s=arrival_s, policy=int(msg.overrun_policy),
        mode=int(msg.mode), max_new_tokens=int(msg.max_new_tokens),
        pessimistic_factor=float(msg.pessimistic_factor),
        # Instructions recorded before these fields existed carry none: the node decides.
        eviction_ratio=float(getattr(msg, 'eviction_ratio', 0.0)),
        expected_tokens=int(getattr(msg, 'expected_tokens', 0)),
        token_deadline_s=_seconds(deadline) if deadline is not None else 0.0,
        precision=str(getattr(msg, 'precision', '')),
        system_prompt=str(getattr(msg, 'system_prompt', '')),
        json_schema=str(getattr(msg, 'json_schema', '')), grammar=str(getattr(msg, 'grammar', '')))


def serialize(msg, msgtype: str) -> bytes:
    """Return a rosbags message as CDR bytes (what rclpy publishes and ros2 bag stores)."""
    return bytes(typestore().serialize_cdr(msg, msgtype))


def deserialize(raw: bytes, msgtype: str):
    """Return the rosbags message of CDR ``raw`` bytes."""
    return typestore().deserialize_cdr(raw, msgtype)


# -- writing ------------------------------------------------------------------------------

def write_bag(path, topics: dict, records: Iterable, storage: str = 'sqlite3',
              custom: dict | None = None) -> Path:
    """Write serialized messages to a new bag and return its path.

    ``topics`` maps topic name to message type (registered in ``typestore()``);
    ``records`` yields ``(topic, log_time_ns, cdr_bytes)``, written in the order
    given. ``custom`` goes to the bag metadata's ``custom_data``.
    """
    path = Path(path)
    plugin = storage_plugin(storage)
    if path.exists():
        raise BagExistsError(f'{path} exists already; rosbag2 bags are never overwritten')
    store = typestore()
    for topic, msgtype in topics.items():
        if msgtype not in store.types:
            raise ValueError(f'unknown message type {msgtype!r} for topic {topic}')
    try:
        with Writer(path, version=Writer.VERSION_LATEST, storage_plugin=plugin) as writer:
            for key, value in (custom or {}).items():
                writer.set_custom_data(key, str(value))
            connections = {
                topic: writer.add_connection(topic, msgtype, typestore=store,
                                             offered_qos_profiles=[QOS])
                for topic, msgtype in topics.items()}
            for topic, log_time_ns, raw in records:
                if topic not in connections:
                    raise ValueError(f'record on topic {topic!r} not declared in topics')
                writer.write(connections[topic], int(log_time_ns), raw)
    except WriterError as exc:
        raise BagError(f'cannot write bag {path}: {exc}') from exc
    return path


def write_workload(path, items: Sequence[WorkloadItem], *, topic: str = DEFAULT_TOPIC,
                   storage: str = 'sqlite3', start_ns: int | None = None) -> Path:
    """Write a workload as a bag of Instructions on ``topic``; return the bag path.

    Each message is logged (and its header stamped) at ``start_ns`` plus its
    arrival offset; ``start_ns`` defaults to now.
    """
    items = check_workload(items)
    start_ns = time.time_ns() if start_ns is None else int(start_ns)
    if start_ns < 0:
        raise ValueError(f'start_ns must be >= 0 (got {start_ns})')

    def records():
        for item in items:
            log_time = start_ns + round(item.arrival_s * 1e9)
            yield topic, log_time, serialize(instruction_msg(item, log_time), INSTRUCTION)

    return write_bag(path, {topic: INSTRUCTION}, records(), storage, {START_KEY: start_ns})


# -- reading ------------------------------------------------------------------------------

@contextmanager
def open_bag(path) -> Iterator[Reader]:
    """Open a bag (directory, ``.db3`` or ``.mcap``) for reading; map failures to BagError."""
    path = Path(path)
    if not path.exists():
        raise BagNotFoundError(f'bag {path} does not exist')
    if path.is_dir() and not (path / 'metadata.yaml').is_file():
        raise BagFormatError(f'{path} is not a rosbag2 bag: the directory has no metadata.yaml')
    if path.is_file() and path.suffix not in BAG_FILE_SUFFIXES:
        raise BagFormatError(f'{path} is not a rosbag2 bag: expected a bag directory or a '
                             f'{" or ".join(BAG_FILE_SUFFIXES)} file')
    try:
        reader = Reader(path)
        reader.open()
    except Exception as exc:  # noqa: BLE001 - rosbags, sqlite and OS errors all mean "not a bag"
        raise BagFormatError(f'cannot read bag {path} (corrupt or truncated?): '
                             f'{_why(exc)}') from exc
    try:
        yield reader
    finally:
        try:
            reader.close()
        except Exception:  # noqa: BLE001 - closing a broken bag must not mask the real error
            pass


def _why(exc: Exception) -> str:
    return str(exc) or type(exc).__name__


def bag_topics(path) -> dict:
    """Return ``{topic: message type}`` of a bag."""
    with open_bag(path) as reader:
        return {topic: info.msgtype for topic, info in reader.topics.items()}


def read_messages(path, topic: str, msgtype: str) -> list:
    """Return ``[(log_time_ns, message, cdr_bytes)]`` of ``topic`` in log-time order.

    Messages recorded with an earlier definition of ``msgtype`` (this package's, before
    fields were appended to it) decode with that definition; the bytes stay as recorded.
    A topic recorded under the type's legacy name (``legacy_names``) reads the same.
    Raises BagTopicError when the topic is absent, BagTypeError when it carries
    another type (or another definition of ``msgtype``), BagFormatError when a
    message cannot be decoded or fewer messages than recorded can be read.
    """
    path = Path(path)
    with open_bag(path) as reader:
        connections = [c for c in reader.connections if c.topic == topic]
        if not connections:
            topics = ', '.join(sorted(reader.topics)) or 'none'
            raise BagTopicError(f'bag {path} has no topic {topic} (topics: {topics})')
        stores = _stores(path, topic, msgtype, connections)
        expected = sum(c.msgcount for c in connections)
        out = []
        try:
            for connection, log_time, raw in reader.messages(connections=connections):
                raw = bytes(raw)
                msg = _decode(stores[connection.id], path, topic, connection.msgtype, raw,
                              len(out))
                out.append((log_time, msg, raw))
        except BagError:
            raise
        except Exception as exc:  # noqa: BLE001 - storage errors mid-read mean a damaged bag
            raise BagFormatError(f'bag {path} is corrupt or truncated: reading {topic} failed '
                                 f'after {len(out)} messages: {_why(exc)}') from exc
    if len(out) < expected:
        # A truncated database can read back cleanly, just shorter.
        raise BagFormatError(f'bag {path} is truncated: {topic} holds {len(out)} of the '
                             f'{expected} messages its metadata records')
    out.sort(key=lambda record: record[0])
    return out


def _stores(path: Path, topic: str, msgtype: str, connections) -> dict:
    """Return {connection id: the typestore that decodes its messages}."""
    found = sorted({c.msgtype for c in connections})
    if not set(found) <= {msgtype, *legacy_names(msgtype)}:
        raise BagTypeError(f'bag {path}: topic {topic} carries {", ".join(found)}, '
                           f'not {msgtype}')
    ours = typestore()
    stores = {}
    for connection in connections:
        # The name it was recorded under (today's or a legacy one) is the name it decodes as.
        recorded_type = connection.msgtype
        digest = ours.hash_rihs01(recorded_type)
        # Older bags (Humble) record no hash; decoding then has to tell.
        if not connection.digest.startswith('RIHS01_') or connection.digest == digest:
            stores[connection.id] = ours
            continue
        recorded = _recorded_store(connection, recorded_type)
        theirs = recorded.fielddefs[recorded_type][1] if recorded is not None else None
        if not theirs or theirs != ours.fielddefs[recorded_type][1][:len(theirs)]:
            raise BagTypeError(
                f'bag {path}: topic {topic} was recorded with another definition of '
                f'{recorded_type} ({connection.digest}; this package has {digest})')
        stores[connection.id] = recorded  # an earlier form: our fields, fewer of them
    return stores


def _recorded_store(connection, msgtype: str):
    """Return a typestore of the definition a connection recorded (None: none usable)."""
    data = getattr(connection.msgdef, 'data', '')
    if not data:
        return None
    try:
        store = get_typestore(Stores.ROS2_KILTED)
        store.register(get_types_from_msg(data, msgtype))
    except Exception:  # noqa: BLE001 - an unparsable or conflicting definition is foreign
        return None
    return store


def _decode(store, path: Path, topic: str, msgtype: str, raw: bytes, index: int):
    try:
        return store.deserialize_cdr(raw, msgtype)
    except Exception as exc:  # noqa: BLE001 - any decoding failure means foreign data
        raise BagFormatError(f'bag {path}: message {index} on {topic} is not a valid '
                             f'{msgtype}: {_why(exc)}') from exc


def read_workload(path, topic: str = DEFAULT_TOPIC) -> WorkloadBag:
    """Read the Instructions on ``topic`` back as a workload.

    Arrival offsets count from the start recorded by ``write_workload``, else
    (bags recorded elsewhere) from the first message, as ``ros2 bag play`` does.
    """
    path = Path(path)
    records = read_messages(path, topic, INSTRUCTION)
    start_ns = _recorded_start(path)
    if start_ns is None or (records and start_ns > records[0][0]):
        start_ns = records[0][0] if records else 0
    messages = []
    current = typestore().types[INSTRUCTION]
    for log_time, msg, raw in records:
        try:
            item = item_from_msg(msg, (log_time - start_ns) / 1e9)
        except ValueError as exc:
            raise BagFormatError(f'bag {path}: Instruction at {log_time} ns on {topic} cannot '
                                 f'be replayed: {exc}') from exc
        if not isinstance(msg, current):
            # Recorded with an earlier definition: replay publishes today's, same values.
            raw = serialize(instruction_msg(item, _ns(msg.header.stamp)), INSTRUCTION)
        messages.append(BagInstruction(log_time, item, raw))
    return WorkloadBag(path, topic, start_ns, messages)


def _recorded_start(path: Path) -> int | None:
    with open_bag(path) as reader:
        # rosbags keeps custom_data only on the directory reader's metadata.
        metadata = getattr(reader.storage, 'metadata', None)
        custom = getattr(metadata, 'custom', None) or {}
    try:
        return int(custom[START_KEY])
    except (KeyError, TypeError, ValueError):
        return None
