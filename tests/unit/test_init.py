"""The public API module: every exported name is importable, and type checkers see the same
names (imported under ``TYPE_CHECKING``) as the lazy ``__getattr__`` gives at run time."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import django_jobguard

SOURCE = Path(django_jobguard.__file__).read_text()


def _type_checking_imports() -> dict[str, str]:
    """``{name: module}`` of the imports inside ``if TYPE_CHECKING:``."""
    tree = ast.parse(SOURCE)
    block = next(node for node in tree.body if isinstance(node, ast.If)
                 and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
    return {alias.name: node.module for node in block.body
            if isinstance(node, ast.ImportFrom) and node.module for alias in node.names}


def test_type_checkers_see_every_exported_name_as_it_is_at_run_time():
    seen = _type_checking_imports()
    assert sorted(seen) == django_jobguard.__all__
    for name, module in seen.items():
        assert getattr(django_jobguard, name) is getattr(importlib.import_module(module), name)
