# SPDX-License-Identifier: Apache-2.0
"""Size limits of the product's code, kept by CI beside the layering test (test_layers.py).

A module a newcomer reads in one sitting, a class that is not a god class, a function
that fits on a screen: no module over MODULE_LINES in serving/ or ros/, no class over
CLASS_LINES and no function over FUNCTION_LINES in core/, runtime/, serving/, ros/. A
part over its limit fails with its name and size.
"""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / 'timebill_ros'
MODULE_LINES, CLASS_LINES, FUNCTION_LINES = 450, 300, 80
MODULE_LIMITED = ('serving', 'ros')
PART_LIMITED = ('core', 'runtime', 'serving', 'ros')


def oversized(path: Path, limit_module: bool, root: Path = PACKAGE.parent) -> list:
    """Return 'where: what N lines (limit L)' for each part of ``path`` over its limit."""
    text = path.read_text(encoding='utf-8')
    name = path.relative_to(root)
    found = []
    # The SPDX licence line is not the module's own code.
    lines = len([line for line in text.splitlines()
                 if not line.startswith('# SPDX-License-Identifier:')])
    if limit_module and lines > MODULE_LINES:
        found.append(f'{name}: module {lines} lines (limit {MODULE_LINES})')
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ClassDef):
            kind, limit = 'class', CLASS_LINES
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            kind, limit = 'function', FUNCTION_LINES
        else:
            continue
        size = node.end_lineno - node.lineno + 1
        if size > limit:
            found.append(f'{name}:{node.lineno}: {kind} {node.name} {size} lines '
                         f'(limit {limit})')
    return found


def test_no_module_class_or_function_is_over_its_limit():
    found = []
    for package in PART_LIMITED:
        for path in sorted((PACKAGE / package).rglob('*.py')):
            found += oversized(path, package in MODULE_LIMITED)
    assert not found, 'over the size limits:\n' + '\n'.join(found)


def test_the_check_names_a_part_over_its_limit(tmp_path):
    body = '\n'.join(f'    x{i} = {i}' for i in range(FUNCTION_LINES))
    module = tmp_path / 'probe.py'
    module.write_text(f'class Small:\n    pass\n\n\ndef long_function():\n{body}\n'
                      + '\n' * MODULE_LINES, encoding='utf-8')
    assert oversized(module, limit_module=True, root=tmp_path) == [
        f'probe.py: module {MODULE_LINES + FUNCTION_LINES + 5} lines (limit {MODULE_LINES})',
        f'probe.py:5: function long_function {FUNCTION_LINES + 1} lines '
        f'(limit {FUNCTION_LINES})']
    assert oversized(module, limit_module=False, root=tmp_path) == [
        f'probe.py:5: function long_function {FUNCTION_LINES + 1} lines '
        f'(limit {FUNCTION_LINES})']
