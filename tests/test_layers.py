"""The package's layers (pyproject.toml, DESIGN.md) hold, and no module hides an import of the package in a function."""
import ast
import subprocess
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "mimdm"

#: The only function-local imports of the package allowed, each justified where it stands.
ALLOWED_LOCAL = {
    # `mimdm --help` and usage errors answer before torch, scikit-learn and papermill load.
    ("app/cli.py", "mimdm.app"), ("app/cli.py", "mimdm.core.contract"), ("app/cli.py", "mimdm.core.shipped"),
}


def test_import_layers_contract_is_kept():
    lint = Path(sys.executable).with_name("lint-imports")
    out = subprocess.run([str(lint), "--no-cache"], cwd=PKG.parent, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "Contracts: 1 kept, 0 broken." in out.stdout


def local_package_imports(path: Path, root: Path = PKG) -> set[tuple[str, str]]:
    """(file relative to ``root``, module) of every import of mimdm (or relative import) inside a function of ``path``."""
    found = set()
    for fn in ast.walk(ast.parse(path.read_text())):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                mods = ([node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else
                        ["." * node.level] if isinstance(node, ast.ImportFrom) else
                        [a.name for a in node.names] if isinstance(node, ast.Import) else [])
                for m in mods:
                    if m.startswith("mimdm") or m.startswith("."):
                        found.add((path.relative_to(root).as_posix(), m))
    return found


def test_no_function_local_imports_of_the_package():
    found = set().union(*(local_package_imports(p) for p in PKG.rglob("*.py")))
    assert found - ALLOWED_LOCAL == set()


def test_the_checker_sees_a_local_import(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("import mimdm.core\n\ndef f():\n    from mimdm.core import artifacts\n    from . import data\n    import numpy\n")
    assert local_package_imports(f, tmp_path) == {("m.py", "mimdm.core"), ("m.py", ".")}
