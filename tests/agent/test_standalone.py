"""The files ``broker.agent`` serves run on any instance: one file each, the standard library
only, Python 3.8 syntax; the package itself imports nothing (the API reads them as resources)."""

from __future__ import annotations

import ast
import sys
from importlib.resources import files

import pytest

SERVED = ("agent.py", "broker_sdk.py")


def imported_modules(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "a relative import"
            names.add((node.module or "").split(".")[0])
    return names


@pytest.mark.parametrize("name", SERVED)
def test_a_served_file_imports_only_the_standard_library_with_python_38_syntax(
    name: str,
) -> None:
    source = files("broker.agent").joinpath(name).read_text(encoding="utf-8")
    tree = ast.parse(source, feature_version=(3, 8))
    assert imported_modules(tree) - {"__future__"} <= set(sys.stdlib_module_names)
    assert "from __future__ import annotations" in source  # annotations are never evaluated


def test_the_package_imports_nothing() -> None:
    source = files("broker.agent").joinpath("__init__.py").read_text(encoding="utf-8")
    assert imported_modules(ast.parse(source)) == set()
