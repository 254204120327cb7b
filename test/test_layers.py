"""Imports point down only: core < runtime < serving < ros; benchmarks are never imported."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / 'timebill_ros'
# What each product layer must not import (a package of ours or a third-party module).
FORBIDDEN = {
    'core': {'runtime', 'serving', 'ros', 'cli', 'evaluation', 'torch', 'transformers',
             'kvpress', 'rclpy'},
    'runtime': {'serving', 'ros', 'cli', 'evaluation', 'rclpy'},
    'serving': {'ros', 'cli', 'evaluation', 'rclpy'},
    'ros': {'cli', 'evaluation'},
}


def imported(path: Path) -> set:
    """Return the top-level names a module imports (ours as their subpackage name)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding='utf-8'))):
        modules = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
        for module in modules:
            parts = module.split('.')
            names.add(parts[1] if parts[0] == 'timebill_ros' and len(parts) > 1 else parts[0])
    return names


def test_product_layers_import_only_downwards():
    bad = []
    for layer, forbidden in FORBIDDEN.items():
        for path in sorted((PACKAGE / layer).glob('*.py')):
            for name in sorted(imported(path) & forbidden):
                bad.append(f'{path.relative_to(PACKAGE)} imports {name}')
    assert not bad, '\n'.join(bad)


def test_the_check_sees_a_forbidden_import(tmp_path):
    module = tmp_path / 'm.py'
    module.write_text('from timebill_ros.cli import bench_robot\nimport rclpy.node\n')
    assert imported(module) == {'cli', 'rclpy'}
