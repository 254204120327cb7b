# SPDX-License-Identifier: Apache-2.0
"""timebill_calibrate: profile prefill and decode-step times, fit the ETE, save the profile."""

from __future__ import annotations

import argparse
import sys


def parse_args(argv=None) -> argparse.Namespace:
    """Parse the command line."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument('--model', default='embedded',
                        help="'embedded', 'tiny-random' or a local HF model directory")
    parser.add_argument('--device', default='cpu', choices=('cpu', 'cuda', 'auto'))
    parser.add_argument('--dtype', default='float32',
                        choices=('float32', 'bfloat16', 'float16'))
    parser.add_argument('--quick', action='store_true', help='fewer lengths and repeats')
    parser.add_argument('--out', help='profile YAML path (default: the node looks there)')
    parser.add_argument('--decode-threads', type=int, default=-1,
                        help="decode intra-op threads, as the node's decode_threads "
                             '(-1: probe 1 vs the default on a worker thread)')
    return parser.parse_args(argv)


def report(profile) -> str:
    """Return a markdown summary of a profile's fit and held-out errors."""
    c, h = profile.coefficients, profile.heldout
    lines = [
        f'model {profile.model} on {profile.device} ({profile.dtype}), '
        f'{profile.host}, {profile.date}, torch threads {profile.versions.get("threads")}, '
        f'decode threads {profile.decode_threads()}',
        '',
        f'prefill t = {c["a"]:.3e} N_x^2 + {c["b"]:.3e} N_x + {c["c"]:.3e} s',
        f'decode step t = {c["p"]:.3e} N_kv + {c["q"]:.3e} s',
        '',
        '| phase | held-out lengths | APE per length (%) | MAPE (%) |',
        '|---|---|---|---|',
        '| prefill | {} | {} | {:.2f} |'.format(
            ', '.join(map(str, h['prefill_lengths'])),
            ', '.join(f'{v:.2f}' for v in h['prefill_ape_pct']), h['prefill_mape_pct']),
        '| decode step | {} | {} | {:.2f} |'.format(
            ', '.join(map(str, h['decode_lengths'])),
            ', '.join(f'{v:.2f}' for v in h['decode_ape_pct']), h['decode_mape_pct']),
    ]
    return '\n'.join(lines)


def main(argv=None) -> int:
    """Calibrate and save; print the MAPE table."""
    args = parse_args(argv)
    from timebill_ros.core.profile import default_path
    from timebill_ros.runtime.model import cache_root, load_model, ModelLoadError
    from timebill_ros.runtime.profiler import calibrate, fastest_threads, Grid, QUICK
    try:
        loaded = load_model(args.model, args.device, args.dtype)
    except ModelLoadError as exc:
        print(f'timebill_calibrate: {exc}', file=sys.stderr)
        return 1
    threads = args.decode_threads
    if threads < 0:
        threads, times = fastest_threads(loaded)
        print('decode threads probed: ' + ', '.join(
            f'{n}: {t * 1e3:.1f} ms' for n, t in times.items()) + f' -> {threads}')
    profile = calibrate(loaded, QUICK if args.quick else Grid(), decode_threads=threads)
    path = args.out or default_path(cache_root(), profile.model, profile.device, profile.dtype)
    profile.save(path)
    print(report(profile))
    print(f'\nsaved {path}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
