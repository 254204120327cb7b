# SPDX-License-Identifier: Apache-2.0
"""timebill_monitor: a terminal view of the node's deadlines for operators without rqt.

Subscribes ``/diagnostics`` (the ``<node's full name>: deadlines`` status of the node
named by ``--node``, so two namespaced nodes do not mix) and the node's
``~/telemetry`` (one DeadlineTelemetry per finished goal) and redraws with rich:
the status level and message, the miss rate, queue and ETE figures, and the last
goals with their outcome, budget, slack and TPOT. ``--once S`` prints one frame
after S seconds and exits (a terminal without a TTY, a log, a test).
"""

from __future__ import annotations

import argparse
from collections import deque
from dataclasses import dataclass, field
import sys
import threading

DEADLINES = 'deadlines'  # the section whose level and message the monitor shows
LEVELS = {0: ('OK', 'green'), 1: ('WARN', 'yellow'), 2: ('ERROR', 'red'), 3: ('STALE', 'grey50')}
OUTCOMES = ('COMPLETED', 'KILLED', 'SKIPPED', 'REJECTED', 'CANCELED', 'FAILED')
SHOWN = ('miss_rate', 'window_goals', 'accepted', 'rejected', 'met', 'missed', 'queue_length',
         'executing', 'scheduler', 'tpot_p50_s', 'tpot_p99_s', 'ete_abs_error_p50_pct',
         'ete_drift_decode', 'last_precision', 'auto_precision', 'max_batch')


@dataclass
class MonitoredGoal:
    """What the monitor shows of one finished goal."""

    goal_id: str
    outcome: str
    met: bool
    budget_s: float
    e2e_s: float
    slack_s: float
    tokens: int
    tpot_p50_s: float
    precision: str


@dataclass
class MonitorState:
    """The latest status and the last goals, fed from messages (thread-safe)."""

    keep: int = 12
    node: str = '/timebill'  # the node's full name (namespace/name)
    level: int = 3
    message: str = 'no /diagnostics from a timebill node yet'
    hardware_id: str = ''
    values: dict = field(default_factory=dict)
    goals: deque = field(default=None)
    seen: int = 0

    def __post_init__(self):
        """Size the goal list."""
        self.goals = deque(maxlen=self.keep)
        self._lock = threading.Lock()

    def on_diagnostics(self, array) -> None:
        """Take this node's statuses out of a DiagnosticArray (others are ignored).

        The level and message are the deadlines status's; the values are every
        section's (ros/diagnostics.py), an engine's under '<key> (<section>)'.
        """
        prefix = '/' + self.node.strip('/') + ': '
        for status in array.status:
            if not status.name.startswith(prefix):
                continue
            section = status.name[len(prefix):]
            values = {(kv.key if not section.startswith('engine ') else
                       f'{kv.key} ({section})'): kv.value for kv in status.values}
            with self._lock:
                self.values.update(values)
                if section == DEADLINES:
                    self.level = int.from_bytes(status.level, 'little') \
                        if isinstance(status.level, bytes) else int(status.level)
                    self.message, self.hardware_id = status.message, status.hardware_id

    def on_telemetry(self, msg) -> None:
        """Record one finished goal."""
        plan = msg.plan
        precision = plan.precision_mix or plan.precision or 'full'
        outcome = OUTCOMES[msg.outcome] if msg.outcome < len(OUTCOMES) else str(msg.outcome)
        goal = MonitoredGoal(msg.goal_id[:8], outcome, bool(msg.deadline_met), msg.budget_s,
                             msg.e2e_s, msg.slack_s, int(msg.tokens), msg.tpot_p50_s, precision)
        with self._lock:
            self.goals.appendleft(goal)
            self.seen += 1

    def render(self):
        """Return the rich renderable of the current state."""
        from rich.console import Group
        from rich.panel import Panel
        from rich.table import Table
        with self._lock:
            level, message, values = self.level, self.message, dict(self.values)
            goals, seen, hardware = list(self.goals), self.seen, self.hardware_id
        name, colour = LEVELS.get(level, (str(level), 'white'))
        head = Table.grid(padding=(0, 2))
        head.add_row(f'[bold {colour}]{name}[/]', message)
        facts = Table(show_header=False, box=None, padding=(0, 1))
        for key in SHOWN:
            if key in values:
                facts.add_row(key, values[key])
        recent = Table(title=f'last goals ({seen} seen)', expand=True)
        for column in ('goal', 'outcome', 'met', 'budget s', 'e2e s', 'slack s', 'tokens',
                       'TPOT p50 ms', 'precision'):
            recent.add_column(column)
        for g in goals:
            style = 'green' if g.met else ('red' if g.outcome != 'CANCELED' else 'grey50')
            recent.add_row(g.goal_id, g.outcome, 'yes' if g.met else 'no', f'{g.budget_s:.2f}',
                           f'{g.e2e_s:.2f}', f'{g.slack_s:+.2f}', str(g.tokens),
                           f'{g.tpot_p50_s * 1e3:.1f}', g.precision, style=style)
        return Panel(Group(head, facts, recent), title=f'timebill monitor {hardware}'.strip())


def main(argv=None) -> int:
    """Subscribe and redraw until Ctrl-C (or print one frame with --once)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--node', default='/timebill',
                        help="the node's full name, namespace/name (e.g. /robot1/timebill)")
    parser.add_argument('--once', type=float, default=0.0,
                        help='print one frame after this many seconds and exit')
    parser.add_argument('--keep', type=int, default=12, help='goals listed')
    args = parser.parse_args(argv)
    import rclpy
    from rclpy.executors import SingleThreadedExecutor
    from rich.console import Console
    from rich.live import Live
    from diagnostic_msgs.msg import DiagnosticArray
    from timebill_msgs.msg import DeadlineTelemetry
    from timebill_ros.ros.qos import reliable
    state = MonitorState(keep=args.keep, node=args.node)
    rclpy.init()
    node = rclpy.create_node('timebill_monitor')
    node.create_subscription(DiagnosticArray, '/diagnostics', state.on_diagnostics, 10)
    node.create_subscription(DeadlineTelemetry, '/' + args.node.strip('/') + '/telemetry',
                             state.on_telemetry, reliable())
    executor = SingleThreadedExecutor()
    executor.add_node(node)
    console = Console()
    stop = threading.Event()
    try:
        if args.once > 0:
            deadline = node.get_clock().now().nanoseconds + int(args.once * 1e9)
            while node.get_clock().now().nanoseconds < deadline:
                executor.spin_once(timeout_sec=0.1)
            console.print(state.render())
            return 0
        with Live(state.render(), console=console, refresh_per_second=4) as live:
            while not stop.is_set():
                executor.spin_once(timeout_sec=0.25)
                live.update(state.render())
    except KeyboardInterrupt:
        pass
    finally:
        executor.shutdown()
        node.destroy_node()
        rclpy.try_shutdown()
    return 0


if __name__ == '__main__':
    sys.exit(main())
