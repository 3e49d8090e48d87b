"""The package's shape: the root holds only its listed modules, the wings keep their
layers, no import cycles (TYPE_CHECKING included), the 0.2.x import paths and the
documented ones, typed for users."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "pg_scheduler"


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
        tree = ast.parse(path.read_text(), str(path))
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


def test_the_enqueue_wing_never_imports_the_engine() -> None:
    graph = _import_graph(everywhere=True)
    assert "pg_scheduler.store" in graph["pg_scheduler.enqueue.producer"]  # the graph sees it
    arrows = [
        f"{name} -> {target}"
        for name, targets in graph.items()
        if name.startswith("pg_scheduler.enqueue")
        for target in targets
        if target == "pg_scheduler.engine" or target.startswith("pg_scheduler.engine.")
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
    scheduler.py (TYPE_CHECKING and function-level imports included)."""
    allowed = ("pg_scheduler", "pg_scheduler.testing", "pg_scheduler.sync_client")
    tools = ("pg_scheduler.cli", "pg_scheduler.dashboard")
    importers = sorted(
        name
        for name, targets in _import_graph(everywhere=True).items()
        if "pg_scheduler.scheduler" in targets
        and name not in allowed
        and not any(name == t or name.startswith(t + ".") for t in tools)
    )
    assert importers == []


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
            for node in ast.parse(path.read_text()).body
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
    assert "function:pg_scheduler_workflow_job_done" in functions
    assert "workflow_sql._CHECKPOINT" not in writers  # workflow_steps.status is another column
    writers |= functions
    listed = {t.statement for t in TRANSITIONS}
    assert writers - listed == set(), "status writers missing from states.TRANSITIONS"
    assert listed - writers == set(), "TRANSITIONS names statements that do not exist"
