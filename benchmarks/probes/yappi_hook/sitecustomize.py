# SPDX-License-Identifier: Apache-2.0
"""Profile a node process with yappi between two signals: a lab hook, never installed.

Put this folder first on PYTHONPATH and set TIMEBILL_YAPPI_OUT=<file stem> in the node's
environment (benchmarks.bench_goal_rate --profile does): SIGUSR1 starts yappi on every
thread (CPU clock), SIGUSR2 stops it and writes <stem>.txt (threads, then functions by
own time) and <stem>.pstat. Without the variable, importing this does nothing.
"""

import os
import signal

OUT = os.environ.get('TIMEBILL_YAPPI_OUT', '')


def start(*_):
    """Start profiling every thread on the CPU clock."""
    import yappi
    yappi.set_clock_type('cpu')
    yappi.start(builtins=False, profile_threads=True)


def stop(*_):
    """Stop profiling and write the summary and the pstat file."""
    import yappi
    yappi.stop()
    functions = yappi.get_func_stats()
    functions.save(f'{OUT}.pstat', type='pstat')
    with open(f'{OUT}.txt', 'w', encoding='utf-8') as handle:
        yappi.get_thread_stats().print_all(out=handle)
        functions.sort('tsub').print_all(out=handle, columns={
            0: ('name', 90), 1: ('ncall', 9), 2: ('tsub', 9), 3: ('ttot', 9)})


if OUT:
    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)
