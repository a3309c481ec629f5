"""Code hashes that decide which pipeline stages rerun: the import closure of what a stage runs.

A rule's ``code`` param (``rules/common.smk``) hashes its script, its stage's entry module and
every ``capacity_pack`` module they import, transitively (every ``import`` in the :mod:`ast`,
function-local ones included, ``if TYPE_CHECKING:`` ones not). A module's hash is
``sha256(ast.dump(tree, include_attributes=False))`` without docstrings, so comments, formatting
and docstrings rerun nothing; a stage's is the sha256 of the JSON list of sorted
``[name, module hash]`` pairs. Why :mod:`ast`, not ``grimp``: each module is parsed to hash its
tree anyway, and grimp cannot read a rule script. Hashes are cached per process and, through
:func:`use_cache_file`, on disk keyed by the file's bytes, this module's code and Python's
minor version. Method: docs/reference.md, 'The code hash in full'.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

PACKAGE = __name__.rpartition(".")[0]
#: The package's own directory: the modules hashed are the ones beside this file.
PACKAGE_DIR = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Parsed:
    """One parsed source file: its tree's hash and the project modules it may import."""

    digest: str
    imports: tuple[str, ...]


class CodeHashError(LookupError):
    """An entry point that is neither a module of the package nor a readable script."""


@functools.cache
def module_path(name: str) -> Path | None:
    """The source file of a module of this package (a package's ``__init__.py``), or None."""
    parts = name.split(".")
    if parts[0] != PACKAGE:
        return None
    base = PACKAGE_DIR.joinpath(*parts[1:])
    for path in (base / "__init__.py", base.with_suffix(".py")):
        if path.is_file():
            return path
    return None


def _strip_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list):
            node.body = [s for s in body if not _is_bare_string(s)]
    return tree


def _is_bare_string(stmt: ast.stmt) -> bool:
    return (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Constant)
        and isinstance(stmt.value.value, str)
    )


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(tree: ast.AST) -> Iterable[ast.Import | ast.ImportFrom]:
    """Every import statement in the tree, at any depth, outside ``if TYPE_CHECKING:`` bodies."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
        else:
            stack.extend(ast.iter_child_nodes(node))


def _with_parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def _imported_names(tree: ast.AST, package: str) -> set[str]:
    """Dotted names a tree's imports may run; ``package`` resolves relative imports."""
    names: set[str] = set()
    for node in _import_nodes(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                names.update(_with_parents(alias.name))
            continue
        if node.level:  # relative: ``.`` is the package itself, each further dot its parent
            parts = package.split(".")
            anchor = parts[: len(parts) - node.level + 1]
            base = ".".join(anchor + ([node.module] if node.module else []))
        else:
            base = node.module or ""
        names.update(_with_parents(base))
        # ``from a import b``: b may be a submodule; module_path() tells which later.
        names.update(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")
    return names


# A file's hash and imported names depend only on its bytes, its package, this module's code
# and Python's ast format, so they are kept on disk under those keys: a Snakefile parse then
# reads each source file but parses only the changed ones.
_DISK: dict = {"path": None, "entries": {}, "used": set(), "dirty": False}
_MAX_ENTRIES = 2000


def _cache_version() -> str:
    own = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()
    return f"{own} python{sys.version_info[0]}.{sys.version_info[1]}"


def use_cache_file(path: str | Path) -> None:
    """Keep parsed files' hashes in ``path`` (JSON) across processes; unreadable means empty."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
        entries = doc["entries"] if doc.get("version") == _cache_version() else {}
        entries = {k: [d, list(c)] for k, (d, c) in entries.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        entries = {}
    _DISK.update(path=path, entries=entries, dirty=False)


def cache_file() -> Path | None:
    """The file :func:`use_cache_file` named in this process (None: hashes kept in memory only)."""
    return _DISK["path"]


def _save_cache() -> None:
    path = _DISK["path"]
    if path is None or not _DISK["dirty"]:
        return
    entries = _DISK["entries"]
    if len(entries) > _MAX_ENTRIES:  # old versions of files pile up: keep this process's
        entries = {k: v for k, v in entries.items() if k in _DISK["used"]}
    doc = json.dumps({"version": _cache_version(), "entries": entries})
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(doc)
        os.replace(tmp, path)
    except OSError:
        return  # a cache that cannot be written only costs time
    _DISK["dirty"] = False


def _digest_and_candidates(source: bytes, filename: str, package: str) -> tuple[str, list[str]]:
    tree = ast.parse(source, filename=filename)
    candidates = sorted(n for n in _imported_names(tree, package) if n.split(".")[0] == PACKAGE)
    dump = ast.dump(_strip_docstrings(tree), include_attributes=False)
    return hashlib.sha256(dump.encode()).hexdigest(), candidates


@functools.cache
def parse_file(path: Path, package: str = "") -> Parsed:
    """Hash and imports of one source file, parsed once per process (and once per content
    when :func:`use_cache_file` named a cache)."""
    source = path.read_bytes()
    key = f"{hashlib.sha256(source).hexdigest()} {package}"
    _DISK["used"].add(key)
    hit = _DISK["entries"].get(key)
    if hit is None:
        hit = _DISK["entries"][key] = list(_digest_and_candidates(source, str(path), package))
        _DISK["dirty"] = True
    digest, candidates = hit
    return Parsed(digest, tuple(n for n in candidates if module_path(n)))


def _parse_module(name: str) -> Parsed:
    path = module_path(name)
    if path is None:
        raise CodeHashError(f"{name}: not a module of {PACKAGE} under {PACKAGE_DIR}")
    return parse_file(path, name if path.name == "__init__.py" else name.rpartition(".")[0])


def _entry(entry: str | Path) -> tuple[str, Parsed]:
    """An entry point as (name in the hash, parsed file): a module name or a script's path."""
    if isinstance(entry, Path) or str(entry).endswith(".py"):
        path = Path(entry)
        if not path.is_file():
            raise CodeHashError(f"{entry}: no such script")
        return path.name, parse_file(path.resolve())
    name = entry if entry.split(".")[0] == PACKAGE else f"{PACKAGE}.{entry}"
    return name, _parse_module(name)


def direct_imports(name: str) -> tuple[str, ...]:
    """The package's modules one module imports itself (see the module docstring for which)."""
    return _parse_module(name if name.split(".")[0] == PACKAGE else f"{PACKAGE}.{name}").imports


@functools.cache
def _closure_of_module(name: str) -> frozenset[str]:
    seen = {name, *_with_parents(name)[:-1]}
    todo = list(seen)
    while todo:
        for dep in _parse_module(todo.pop()).imports:
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return frozenset(seen)


def closure(*entries: str | Path) -> list[str]:
    """Sorted names of the package's modules the entries import, directly or not.

    An entry is a module name (``"capacity_pack.measure.sweep"``, or ``"measure.sweep"``
    relative to the package) or the path of a script (``scripts/sweep.py``); a module entry is
    in its own closure.
    """
    names: set[str] = set()
    for entry in entries:
        name, parsed = _entry(entry)
        if module_path(name):
            names |= _closure_of_module(name)
        for dep in parsed.imports:
            names |= _closure_of_module(dep)
    return sorted(names)


def forget() -> None:
    """Forget what this process parsed (the disk cache stays): for a caller that edits files."""
    for cached in (module_path, parse_file, _closure_of_module):
        cached.cache_clear()
    _DISK["used"] = set()


def code_hash(*entries: str | Path) -> str:
    """sha256 of the code the entries run: their closure's module trees, plus each script's."""
    pairs = {name: _parse_module(name).digest for name in closure(*entries)}
    for entry in entries:
        name, parsed = _entry(entry)
        pairs.setdefault(name, parsed.digest)
    doc = json.dumps(sorted(pairs.items()), separators=(",", ":"))
    _save_cache()
    return hashlib.sha256(doc.encode()).hexdigest()
