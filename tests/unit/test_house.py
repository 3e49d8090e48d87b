"""The package's shape: the root holds only its listed modules, the wings keep their
layers, no import cycles (TYPE_CHECKING included), parts composed rather than mixed
in (nothing below the Scheduler names it), the 0.2.x import paths and the
documented ones, typed for users."""

from __future__ import annotations

import ast
import gc
import importlib
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "pg_scheduler"


def _parse(path: Path) -> ast.Module:
    """``path``'s syntax tree, parsed with the garbage collector held off: a
    finalizer run by a collection in the middle of the parse (an unretrieved
    task's error logged, left by an earlier test) upsets CPython 3.11's count
    of the parser's recursion ("AST constructor recursion depth mismatch")."""
    gc.disable()
    try:
        return ast.parse(path.read_text(), str(path))
    finally:
        gc.enable()


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _module_level_imports(
    tree: ast.Module, type_checking: bool = False
) -> list[ast.Import | ast.ImportFrom]:
    """Imports run when the module is imported: not inside functions; those under
    ``if TYPE_CHECKING:`` too when ``type_checking``."""
    found: list[ast.Import | ast.ImportFrom] = []
    pending: list[ast.stmt] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        elif isinstance(node, ast.If):
            if type_checking or not _is_type_checking(node.test):
                pending.extend(node.body)
            pending.extend(node.orelse)
        elif isinstance(node, ast.Try):
            pending.extend(node.body + node.orelse + node.finalbody)
            for handler in node.handlers:
                pending.extend(handler.body)
    return found


def _all_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Every import in the module: at module level, under TYPE_CHECKING, in functions."""
    return [node for node in ast.walk(tree) if isinstance(node, ast.Import | ast.ImportFrom)]


def _import_graph(everywhere: bool = False) -> dict[str, set[str]]:
    """Module -> the package modules it imports: at module level, TYPE_CHECKING
    imports included (mypy reads them: a loop there is a loop in the design); with
    ``everywhere``, imports inside functions too."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = _parse(path)
        found = _all_imports(tree) if everywhere else _module_level_imports(tree, True)
        for node in found:
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                # "from .x import y": y may be a submodule or a name in x.
                targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
            for target in targets:
                if target in modules and target != name:
                    graph[name].add(target)
                    # Importing a.b.c runs a/__init__ and a/b/__init__ first.
                    parts = target.split(".")
                    for i in range(1, len(parts)):
                        parent = ".".join(parts[:i])
                        if (
                            parent in modules
                            and parent != name
                            and not name.startswith(parent + ".")
                        ):
                            graph[name].add(parent)
    return graph


def test_no_import_cycle_inside_the_package_type_checking_included() -> None:
    graph = _import_graph()
    assert graph.get("pg_scheduler.scheduler")
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append([*path[path.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


# The package root: the public faces, the shared vocabulary and the 0.2.x import
# paths. Everything else lives in a wing (api/, enqueue/, engine/, services/,
# periodic/, notify/, observe/, support/, store/, cli/, dashboard/).
ROOT_MODULES = {
    # public faces
    "__init__",
    "scheduler",
    "sync_client",
    "testing",
    "embedded",
    # shared vocabulary (limits: RateLimit and its parsing, used by tasks and the claim)
    "enums",
    "models",
    "states",
    "config",
    "tasks",
    "context",
    "limits",
    # batching: BatchItem and a batch task's options (tasks, enqueue and the engine read them)
    "batching",
    # 0.2.x import paths
    "job_spec",
    "job_priority",
    "conflict_resolution",
    "vacuum",
    "polling",
}


def test_the_root_holds_only_its_listed_modules() -> None:
    found = {path.stem for path in PACKAGE.glob("*.py")}
    assert found - ROOT_MODULES == set(), "new module in the package root: put it in a wing"
    assert ROOT_MODULES - found == set(), "listed root modules that no longer exist"


def _imports_outside(wing: str, allowed: tuple[str, ...]) -> list[str]:
    graph = _import_graph(everywhere=True)
    return sorted(
        f"{name} -> {target}"
        for name, targets in graph.items()
        if name == wing or name.startswith(wing + ".")
        for target in targets
        if not any(target == a or target.startswith(a + ".") for a in allowed)
    )


def test_support_imports_nothing_above_it() -> None:
    """support/ is the lowest layer: the standard library, third-party packages
    and other support modules only (anywhere in the module, TYPE_CHECKING too)."""
    assert _import_graph(everywhere=True)["pg_scheduler.support.codec"]  # the graph sees it
    assert _imports_outside("pg_scheduler.support", ("pg_scheduler.support",)) == []


def test_the_enqueue_wing_never_imports_the_engine_nor_the_scheduler() -> None:
    """The producer serves the Scheduler and the sync client alike: it never
    reaches into the engine or the Scheduler (a Scheduler hands it what it
    needs, such as the in-process start, as a function)."""
    graph = _import_graph(everywhere=True)
    assert "pg_scheduler.store" in graph["pg_scheduler.enqueue.producer"]  # the graph sees it
    banned = ("pg_scheduler.engine", "pg_scheduler.scheduler")
    arrows = [
        f"{name} -> {target}"
        for name, targets in graph.items()
        if name.startswith("pg_scheduler.enqueue")
        for target in targets
        if any(target == b or target.startswith(b + ".") for b in banned)
    ]
    assert arrows == []


def test_the_workflows_wing_never_imports_the_engine() -> None:
    """The executor calls workflows/runner.py; never the other way round."""
    graph = _import_graph(everywhere=True)
    assert "pg_scheduler.workflows.runner" in graph["pg_scheduler.engine.executor"]
    arrows = [
        f"{name} -> {target}"
        for name, targets in graph.items()
        if name.startswith("pg_scheduler.workflows")
        for target in targets
        if target == "pg_scheduler.engine" or target.startswith("pg_scheduler.engine.")
    ]
    assert arrows == []


def test_only_the_faces_and_the_tools_import_the_scheduler() -> None:
    """The parts see the Scheduler through small protocols, never by importing
    scheduler.py (TYPE_CHECKING and function-level imports included). The sync
    client holds the producer, not a Scheduler."""
    allowed = ("pg_scheduler", "pg_scheduler.testing")
    tools = ("pg_scheduler.cli", "pg_scheduler.dashboard")
    importers = sorted(
        name
        for name, targets in _import_graph(everywhere=True).items()
        if "pg_scheduler.scheduler" in targets
        and name not in allowed
        and not any(name == t or name.startswith(t + ".") for t in tools)
    )
    assert importers == []


def _type_checking_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """The imports under ``if TYPE_CHECKING:`` anywhere in the module."""
    return [
        node
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and _is_type_checking(block.test)
        for stmt in block.body
        for node in ast.walk(stmt)
        if isinstance(node, ast.Import | ast.ImportFrom)
    ]


def test_nothing_below_the_scheduler_names_it_even_for_type_checking() -> None:
    """Every module scheduler.py imports, directly or not, sees the Scheduler
    only through what it is given; no ``if TYPE_CHECKING: from ..scheduler import``."""
    graph = _import_graph(everywhere=True)
    below: set[str] = set()
    pending = ["pg_scheduler.scheduler"]
    while pending:
        for target in graph[pending.pop()]:
            if target not in below:
                below.add(target)
                pending.append(target)
    assert "pg_scheduler.engine.claimer" in below and "pg_scheduler.api.wiring" in below
    naming = []
    for path in PACKAGE.rglob("*.py"):
        name = _module_name(path)
        if name not in below:
            continue
        for node in _type_checking_imports(_parse(path)):
            written = ast.unparse(node)
            if "scheduler import" in written or "pg_scheduler.scheduler" in written:
                naming.append(f"{name}: {written}")
    assert naming == []


# Mixins not yet turned into parts: (class, its mixin base). May only shrink.
KNOWN_MIXINS = {
    # The store's two halves of statements: Store and the workers' statements.
    ("pg_scheduler.store.jobs.Store", "pg_scheduler.store.workers.WorkerStatements"),
}


def _package_classes() -> list[type]:
    import pkgutil

    import pg_scheduler

    classes = []
    for info in pkgutil.walk_packages(pg_scheduler.__path__, "pg_scheduler."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        classes += [
            value
            for value in vars(module).values()
            if isinstance(value, type) and value.__module__ == module.__name__
        ]
    return classes


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def test_no_class_of_the_package_derives_from_a_mixin() -> None:
    """A class may derive from another class of the package only if that base
    sets itself up (its own ``__init__``) or is an exception. A base without an
    ``__init__`` works on attributes its subclass sets: a mixin reading its
    host. Parts receive what they need in their constructor instead."""
    found = set()
    for cls in _package_classes():
        for base in cls.__bases__:
            if not base.__module__.startswith("pg_scheduler"):
                continue
            if "__init__" in vars(base) or issubclass(base, BaseException):
                continue
            found.add((_qualified(cls), _qualified(base)))
    assert ("pg_scheduler.store.jobs.Store", "pg_scheduler.store.workers.WorkerStatements") in found
    assert found - KNOWN_MIXINS == set(), "a class of the package derives from a mixin"
    assert KNOWN_MIXINS - found == set(), "a known mixin is gone: take it off KNOWN_MIXINS"


def test_the_scheduler_and_the_worker_are_composed_not_mixed() -> None:
    from pg_scheduler import Scheduler
    from pg_scheduler.engine import Worker

    assert Scheduler.__bases__ == (object,)
    assert Worker.__bases__ == (object,)


def test_no_class_body_declares_its_hosts_attributes() -> None:
    """The mark of a mixin: ``if TYPE_CHECKING:`` in a class body, declaring the
    attributes (and methods) of the class it will be mixed into."""
    declaring = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(_parse(path)):
            if isinstance(node, ast.ClassDef) and any(
                isinstance(stmt, ast.If) and _is_type_checking(stmt.test) for stmt in node.body
            ):
                declaring.append(f"{_module_name(path)}.{node.name}")
    assert declaring == []


_DOCUMENTED_IMPORT = re.compile(r"^\s*from (pg_scheduler(?:\.\w+)*) import ([\w, ]+)", re.M)


def test_every_import_the_docs_show_works() -> None:
    """``from pg_scheduler... import ...`` in the README, docs/ and examples/."""
    root = PACKAGE.parent
    texts = [root / "README.md", *root.glob("docs/**/*.md"), *root.glob("examples/**/*.py")]
    seen = 0
    for text_path in texts:
        for module_name, names in _DOCUMENTED_IMPORT.findall(text_path.read_text()):
            module = importlib.import_module(module_name)
            for name in filter(None, (n.strip() for n in names.split(","))):
                assert hasattr(module, name), f"{text_path.name}: {module_name}.{name}"
                seen += 1
    assert seen > 5


# Every name the 0.2.x documentation imports, from the path it documents.
OLD_PATHS = {
    "pg_scheduler": [
        "Scheduler",
        "JobPriority",
        "JobSpec",
        "ConflictResolution",
        "VacuumConfig",
        "VacuumPolicy",
        "VacuumTrigger",
        "PollingConfig",
        "RetryPolicy",
        "periodic",
        "PeriodicJobConfig",
    ],
    "pg_scheduler.scheduler": ["Scheduler"],
    "pg_scheduler.periodic": ["periodic", "PeriodicJobConfig"],
    "pg_scheduler.job_spec": ["JobSpec"],
    "pg_scheduler.job_priority": ["JobPriority"],
    "pg_scheduler.conflict_resolution": ["ConflictResolution"],
    "pg_scheduler.vacuum": ["VacuumConfig", "VacuumPolicy", "VacuumTrigger"],
    "pg_scheduler.polling": ["PollingConfig"],
}


@pytest.mark.parametrize("path", sorted(OLD_PATHS))
def test_each_documented_name_imports_from_its_0_2_path(path: str) -> None:
    module = importlib.import_module(path)
    top = importlib.import_module("pg_scheduler")
    for name in OLD_PATHS[path]:
        value = getattr(module, name)
        assert value is getattr(top, name), f"{path}.{name}"


def test_the_package_ships_py_typed() -> None:
    assert (PACKAGE / "py.typed").is_file()


_SET_CLAUSE = re.compile(r"\bSET\b(.*?)(?:\bWHERE\b|\bFROM\b|\bRETURNING\b|$)", re.S | re.I)
_WRITES_STATUS = re.compile(r"(?<![\w.])status\s*=", re.I)
_INSERT_JOBS = re.compile(r"\bINSERT\s+INTO\s+scheduled_jobs\b[^(]*\(([^)]*)\)", re.S | re.I)
_TARGET = re.compile(r"\b(?:UPDATE|INSERT\s+INTO)\s+(\w+)", re.I)


def _writes_status(sql: str) -> bool:
    """An UPDATE of scheduled_jobs whose SET assigns ``status`` (or a SET with
    no table before it: a fragment such as an ON CONFLICT clause), or an INSERT
    into scheduled_jobs whose columns include ``status``."""
    for m in _SET_CLAUSE.finditer(sql):
        targets = _TARGET.findall(sql, 0, m.start())
        if targets and targets[-1].lower() != "scheduled_jobs":
            continue  # another table's status (workflow_steps)
        if _WRITES_STATUS.search(m[1]):
            return True
    return any(re.search(r"\bstatus\b", m[1]) for m in _INSERT_JOBS.finditer(sql))


_FUNCTION = re.compile(
    r"CREATE\s+OR\s+REPLACE\s+FUNCTION\s+(\w+)\s*\(.*?\$\$(.*?)\$\$", re.S | re.I
)


def _migration_function_writers() -> set[str]:
    """``function:<name>`` for each function the migrations define (its last
    definition) whose body writes scheduled_jobs.status."""
    bodies: dict[str, str] = {}
    for path in sorted((PACKAGE / "store" / "migrations").glob("*.sql")):
        text = re.sub(r"--[^\n]*", "", path.read_text())
        for name, body in _FUNCTION.findall(text):
            bodies[name.lower()] = body
    return {f"function:{name}" for name, body in bodies.items() if _writes_status(body)}


def test_every_statement_that_writes_status_is_in_the_transition_table() -> None:
    from pg_scheduler.states import TRANSITIONS

    store_dir = PACKAGE / "store"
    writers = set()
    for path in store_dir.glob("*.py"):
        module = importlib.import_module(f"pg_scheduler.store.{path.stem}")
        # Constants assigned in this module (not imported from another).
        defined = {
            target.id
            for node in _parse(path).body
            if isinstance(node, ast.Assign)
            for target in node.targets
            if isinstance(target, ast.Name)
        }
        for name in defined:
            value = getattr(module, name)
            if name.lstrip("_").isupper() and isinstance(value, str) and _writes_status(value):
                writers.add(f"{path.stem}.{name}")
    functions = _migration_function_writers()
    # The parsers work: statements, and trigger functions of the migrations.
    assert "job_sql._CLAIM" in writers and "workers._RESCUE" in writers
    assert "function:pg_scheduler_workflow_children_ended" in functions
    assert "workflow_sql._CHECKPOINT" not in writers  # workflow_steps.status is another column
    writers |= functions
    listed = {t.statement for t in TRANSITIONS}
    assert writers - listed == set(), "status writers missing from states.TRANSITIONS"
    assert listed - writers == set(), "TRANSITIONS names statements that do not exist"


def test_the_vocabulary_module_imports_nothing_from_the_package() -> None:
    """enums.py (statuses, priorities, the default queue) sits below every layer,
    store/ and support/ included: it imports only the standard library."""
    imports = _all_imports(ast.parse((PACKAGE / "enums.py").read_text()))
    assert imports  # the parser sees its imports

    def names(node: ast.Import | ast.ImportFrom) -> list[str]:
        if isinstance(node, ast.Import):
            return [alias.name for alias in node.names]
        return ["." if node.level else node.module or ""]

    inside = [
        ast.unparse(node)
        for node in imports
        if any(n == "." or n.split(".")[0] == "pg_scheduler" for n in names(node))
    ]
    assert inside == []


# Modules whose text is the one declaration of the shared vocabulary.
_VOCABULARY = PACKAGE / "enums.py"
_FINAL_STATUS_TEXT = ("completed", "failed", "cancelled", "expired")


def _python_sources() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if p != _VOCABULARY)


def _literal_strings(node: ast.AST) -> set[str]:
    """The elements of a tuple, list or set literal, or a dict's keys, that name
    a status: a string (lower-cased) or a member (``JobStatus.FAILED``, ``FAILED``)."""
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        items: list[ast.expr | None] = list(node.elts)
    elif isinstance(node, ast.Dict):
        items = list(node.keys)
    else:
        return set()
    found = set()
    for item in items:
        if isinstance(item, ast.Constant) and isinstance(item.value, str):
            found.add(item.value)
        elif isinstance(item, ast.Attribute) and item.attr.isupper():
            found.add(item.attr.lower())
        elif isinstance(item, ast.Name) and item.id.isupper():
            found.add(item.id.lower())
    return found


def test_the_final_statuses_are_declared_once() -> None:
    """enums.FINAL_STATUSES is the one list of final statuses: no other module
    spells all four in a literal collection, or as an SQL list of them; derive
    from FINAL_STATUSES / FINAL_STATUS_VALUES instead."""
    from pg_scheduler.enums import FINAL_STATUS_VALUES, FINAL_STATUSES

    assert set(FINAL_STATUS_VALUES) == set(FINAL_STATUSES) == set(_FINAL_STATUS_TEXT)
    found = []
    for path in _python_sources():
        for node in ast.walk(_parse(path)):
            where = f"{path.relative_to(PACKAGE)}:{getattr(node, 'lineno', 0)}"
            if set(_FINAL_STATUS_TEXT) <= _literal_strings(node):
                found.append(where)
            elif (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and all(f"'{status}'" in node.value for status in _FINAL_STATUS_TEXT)
            ):
                found.append(f"{where} (SQL)")
    assert found == [], "final statuses spelled out again: " + ", ".join(found)


def test_the_default_queue_is_named_once() -> None:
    """enums.DEFAULT_QUEUE is the default queue's one spelling: no other module
    has the string "default" as a value, or as an SQL literal ('default')."""
    found = [
        f"{path.relative_to(PACKAGE)}:{node.lineno}"
        for path in _python_sources()
        for node in ast.walk(_parse(path))
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and (node.value == "default" or "'default'" in node.value)
    ]
    assert found == [], 'the default queue spelled "default" again: ' + ", ".join(found)


def test_the_architecture_page_names_every_wing_once() -> None:
    """The tree of docs/architecture.md has one line for each folder of the package,
    and names no folder that is gone."""
    page = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    blocks = [b.split("```", 1)[0] for b in page.split("```text\n")[1:]]
    (tree,) = [b for b in blocks if b.startswith("pg_scheduler/ ")]
    # The wings: the indented lines that open with a folder ("  api/   ...").
    listed = [
        line.split()[0].rstrip("/")
        for line in tree.splitlines()
        if line.startswith("  ") and line.split()[0].endswith("/")
    ]
    wings = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists())
    assert sorted(listed) == wings
