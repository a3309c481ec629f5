"""Code hashes that decide which pipeline stages rerun: the import closure of what a stage runs.

What reruns when: a rule's ``code`` param (``rules/common.smk``) is the hash of the code its job
runs, and Snakemake reruns a job whose params changed, then every job downstream of it. That
code is the rule's script (``scripts/<rule>.py``), its stage's entry module (which the script
resolves by name from :mod:`capacity_pack.stages`) and every ``capacity_pack`` module they
import, transitively; a measurement against the simulated target adds the closure of
``capacity_pack.sim.__main__``, which it starts as a subprocess. A real change to any of those
modules reruns the stage and its dependents; a comment or docstring edit reruns nothing; a change
to a module outside the closure (a Grafana panel, for a measurement) reruns nothing of that
stage.

Closure. Each module's source is parsed with :mod:`ast`, and every ``import`` and
``from ... import`` statement anywhere in it counts, function-local ones included (much of the
library imports lazily to stay cheap), except those inside ``if TYPE_CHECKING:`` blocks, which
never run. ``import a.b.c`` runs ``a``, ``a.b`` and ``a.b.c``; ``from a.b import c`` runs ``a``,
``a.b`` and, where ``c`` is a submodule rather than a name, ``a.b.c``; relative imports resolve
against the importing module's package. So each package ``__init__`` on a module's path is in
the closure too. Only modules of this package count: third-party code is pinned by the
environment, not hashed. Imports by computed name (``importlib.import_module(f"...")``) are not
seen; a rule that runs one names it as an extra entry (every rule does for its stage's entry
module, and the ``track`` rule also for the tracked stage's record module).

Hash. A module's hash is ``sha256(ast.dump(tree, include_attributes=False))`` of its syntax tree
with docstrings removed: comments and formatting are not in the tree, line and column numbers
are left out of the dump, and the docstring (the first statement of a module, class or function
when it is a string literal) is dropped, as is any other statement that is a bare string literal
(attribute docstrings), which has no effect when run. A stage's hash is
``sha256`` of the JSON list of sorted ``[name, module hash]`` pairs, scripts named by their file
name. Two stages with the same code therefore have the same hash, wherever the checkout lies.

Why :mod:`ast` and not ``grimp`` for the closure: grimp (the graph library under import-linter)
would fit, as it sees function-local imports too and can leave out ``TYPE_CHECKING`` ones (the
tests check that both find the same closure for every module). But every module of a closure has
to be parsed here anyway to hash its tree, and the import walk over that tree is free, while
grimp scans the whole package again (about 0.15 s on each Snakefile parse, or a cache directory
of its own), and it cannot read a rule script, which is no module of any package.

Cost. Parsing the package's 25k lines takes one to two seconds, so a file's hash and imported
names are kept per process (:func:`functools.cache`) and, where the caller names a cache file
(:func:`use_cache_file`; the Snakefile keeps ``.snakemake/codehash.json``), on disk under the
sha256 of the file's bytes, its package, this module's own code and Python's minor version (whose
``ast.dump`` format the hashes depend on: a new Python reruns every stage once). A Snakefile
parse then reads every file but parses only changed ones: about 20 ms for every rule's hash.
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
