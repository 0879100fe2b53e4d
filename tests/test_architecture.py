"""The house rules of docs/design/, read from the source: no import cycles, akocore stays pure.

Imports are read with `ast` (nothing is imported), at module level and inside
functions alike, except under ``if TYPE_CHECKING:``, and so are the module names
given to ``importlib.import_module`` as text (a literal, or the strings of a
module-level table the call looks up, as akocore's lazy exports do). A cycle
counts whatever the level at which its imports sit or the form they take: a lazy
import that hides a cycle is still one.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("akocore", "akosim", "akorun", "analysis")
# What akocore may not use: clocks, sockets, event loops, subprocesses, the shells.
IMPURE_FOR_AKOCORE = {"time", "asyncio", "socket", "aiohttp", "simpy", "subprocess", "threading",
                      "akosim", "akorun", "analysis"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules() -> dict[str, Path]:
    return {module_name(path): path
            for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _called_name(call: ast.Call) -> str:
    func = call.func
    return func.id if isinstance(func, ast.Name) else (
        func.attr if isinstance(func, ast.Attribute) else "")


_DOTTED_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def _text_constants(node: ast.AST) -> set[str]:
    """The strings in `node` that read as dotted module names."""
    return {item.value for item in ast.walk(node)
            if isinstance(item, ast.Constant) and isinstance(item.value, str)
            and _DOTTED_NAME.fullmatch(item.value)}


def _names_given_to_import_module(tree: ast.Module) -> set[str]:
    """Module names an ``import_module(...)`` call is given as text: a string literal, or
    the strings of a module-level table (``_EXPORTS = {...}``) the argument reads."""
    tables: dict[str, set[str]] = {}
    for statement in tree.body:
        if isinstance(statement, ast.Assign):
            targets, value = statement.targets, statement.value
        elif isinstance(statement, ast.AnnAssign) and statement.value is not None:
            targets, value = [statement.target], statement.value
        else:
            continue
        for target in targets:
            if isinstance(target, ast.Name):
                tables[target.id] = _text_constants(value)
    names: set[str] = set()
    for call in ast.walk(tree):
        if not (isinstance(call, ast.Call) and call.args
                and _called_name(call) == "import_module"):
            continue
        names |= _text_constants(call.args[0])
        for item in ast.walk(call.args[0]):
            if isinstance(item, ast.Name):
                names |= tables.get(item.id, set())
    return names


def imported_names(path: Path, module: str) -> set[str]:
    """Every absolute dotted name a module imports (relative imports resolved), and the
    module names it hands to ``import_module`` as text."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    is_package = path.name == "__init__.py"
    names: set[str] = _names_given_to_import_module(tree)

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base if is_package else base[:-1]
                base = base[: len(base) - (node.level - 1)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            names.add(prefix)
            names.update(f"{prefix}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return names


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        targets = set()
        for name in imported_names(path, module):
            # "akocore.settings.schema.RunConfig" -> the longest prefix that is a module
            parts = name.split(".")
            for end in range(len(parts), 0, -1):
                candidate = ".".join(parts[:end])
                if candidate in modules:
                    if candidate != module:
                        targets.add(candidate)
                    break
        graph[module] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def strongconnect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                strongconnect(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            strongconnect(node)
    return found


def _ignores_package_parents(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """A package's __init__ re-exporting its own submodules is not a cycle with them:
    drop edges from a submodule to its own parent package's __init__."""
    return {module: {target for target in targets if not module.startswith(target + ".")}
            for module, targets in graph.items()}


def test_the_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_relative_imports_resolve_to_project_modules(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    source = package / "mod.py"
    source.write_text("from .other import thing\nfrom . import sibling\n")
    assert imported_names(source, "pkg.mod") == {"pkg.other", "pkg.other.thing", "pkg",
                                                  "pkg.sibling"}


def test_module_names_given_to_import_module_count_as_imports(tmp_path):
    source = tmp_path / "lazy.py"
    source.write_text("import importlib\nfrom importlib import import_module\n"
                      "TABLE = {'Thing': 'pkg.things', 'Other': 'pkg.others'}\n"
                      "def get(name):\n"
                      "    importlib.import_module('pkg.direct')\n"
                      "    return import_module(TABLE[name])\n"
                      "LABEL = 'pkg.not_imported'\n")
    names = imported_names(source, "pkg.lazy")
    assert {"pkg.direct", "pkg.things", "pkg.others"} <= names
    assert "pkg.not_imported" not in names


def test_no_import_cycle_between_project_modules():
    found = cycles(_ignores_package_parents(import_graph()))
    assert found == [], "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


@pytest.mark.parametrize(("shell", "other"), [("akosim", "akorun"), ("akorun", "akosim")])
def test_the_shells_do_not_import_each_other(shell, other):
    offenders = sorted(module for module, targets in import_graph().items()
                       if module.split(".")[0] == shell
                       and any(t.split(".")[0] == other for t in targets))
    assert offenders == []


def test_the_runtime_does_not_import_the_launcher():
    """A rank (akorun.runtime) runs whoever started it: the launcher (akorun.launching)
    builds its options and imports it, never the other way round."""
    graph = import_graph()
    found = sorted(f"{module} -> {target}" for module, targets in graph.items()
                   if module.startswith("akorun.runtime") for target in targets
                   if target.startswith("akorun.launching"))
    assert found == [], "akorun.runtime imports akorun.launching: " + "; ".join(found)


def test_akocore_uses_no_clock_socket_event_loop_or_shell():
    offenders = []
    for module, path in project_modules().items():
        if module.split(".")[0] != "akocore":
            continue
        for name in imported_names(path, module):
            if name.split(".")[0] in IMPURE_FOR_AKOCORE:
                offenders.append(f"{module} imports {name}")
    assert offenders == []


def _module_level_calls(tree: ast.Module) -> list[ast.Call]:
    """Calls that run when the module is imported (not inside a def or a class body's def)."""
    calls: list[ast.Call] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            return
        if isinstance(node, ast.Call):
            calls.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return calls


def test_akocore_changes_global_jax_settings_only_in_its_one_explicit_edge():
    """jax.config changes live in akocore.process_setup, inside functions a shell calls;
    importing akocore changes nothing."""
    for module, path in project_modules().items():
        if module.split(".")[0] != "akocore":
            continue
        text = path.read_text(encoding="utf-8")
        at_import = [ast.unparse(call.func) for call in _module_level_calls(ast.parse(text))]
        assert not [name for name in at_import if name.startswith("jax.config")], module
        if module != "akocore.process_setup":
            assert "jax.config.update" not in text, module


# ------------------------------------------------------------ schemes are objects


def _scheme_names() -> set[str]:
    from akocore.schemes.named import SCHEME_NAMES

    return set(SCHEME_NAMES)


# Modules allowed to compare a value with a scheme's name: the schemes package (each
# scheme's own module and the registry).
SCHEME_NAME_COMPARISONS_ALLOWED = ("akocore.schemes",)


def _names_a_scheme(node: ast.expr) -> bool:
    return (isinstance(node, ast.Name) and node.id.endswith("scheme")) or (
        isinstance(node, ast.Attribute) and node.attr.endswith("scheme"))


def _scheme_literals(node: ast.expr, names: set[str]) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str) and node.value in names
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(_scheme_literals(item, names) for item in node.elts)
    return False


def scheme_name_comparisons(tree: ast.AST, names: set[str]) -> list[int]:
    """Lines that compare something called *scheme with a scheme's name
    (``scheme == "ps"``, ``cfg.exchange.scheme in ("ako", "ps")``, ``"ps" != scheme``)."""
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        for left, op, right in zip(operands, node.ops, operands[1:], strict=False):
            if not isinstance(op, ast.Eq | ast.NotEq | ast.In | ast.NotIn):
                continue
            if (_names_a_scheme(left) and _scheme_literals(right, names)) or (
                    _names_a_scheme(right) and _scheme_literals(left, names)):
                lines.append(node.lineno)
    return lines


def test_the_scheme_comparison_finder_finds_the_forms_it_forbids():
    names = {"ako", "ps"}
    source = ('a = cfg.exchange.scheme == "ps"\nb = scheme in ("ako", "x")\n'
              'c = "ps" != run.scheme\nd = init_scheme == "tf.ako"\ne = scheme == other\n')
    assert scheme_name_comparisons(ast.parse(source), names) == [1, 2, 3]


def offending_lines(finder: Callable[[ast.AST], list[int]],
                    allowed: tuple[str, ...]) -> list[str]:
    """"path:line" of each line `finder` finds in a project module outside `allowed`."""
    offenders = []
    for module, path in project_modules().items():
        if module.startswith(allowed):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        offenders += [f"{path.relative_to(ROOT)}:{line}" for line in finder(tree)]
    return offenders


def test_no_module_compares_a_scheme_with_a_name_outside_the_scheme_registry():
    """Shells ask the scheme object (akocore.schemes.registry), not its name."""
    names = _scheme_names()
    assert offending_lines(lambda tree: scheme_name_comparisons(tree, names),
                           SCHEME_NAME_COMPARISONS_ALLOWED) == []


def test_every_scheme_is_one_object_that_builds_its_own_nodes():
    from akocore.schemes import REGISTRY, Scheme, SchemeSpec, build_nodes
    from akocore.settings.schema import ExchangeConfig

    assert set(REGISTRY) == {"ako", "ps", "allreduce", "wagma", "diloco", "streaming-diloco",
                             "quorum-diloco", "sparseloco",
                             "sparta", "noloco"}
    for name, scheme in REGISTRY.items():
        assert isinstance(scheme, Scheme) and scheme.name == name
        spec = SchemeSpec(scheme=name, workers=4, ps_servers=1)
        nodes = build_nodes(spec, 40, None, None)
        assert [node.rank for node in nodes] == [0, 1, 2, 3]
        assert sum(node.is_worker for node in nodes) == spec.training_workers \
            == 4 - (1 if scheme.has_servers else 0)
        exchange = ExchangeConfig(scheme=name)
        assert scheme.staleness_bound(exchange, p_max=3, ssp=1.0) >= 0
        assert isinstance(scheme.variant_label(exchange), str)


# ------------------------------------------------------------ recovery asks, never checks a class

# Modules allowed to check a node's class: the schemes package (each scheme's own nodes).
NODE_CLASS_CHECKS_ALLOWED = ("akocore.schemes",)


def _scheme_node_classes() -> set[str]:
    """The names of every concrete scheme node class: SchemeNode's subclasses, with every
    module of akocore.schemes imported (a new scheme's nodes count at once)."""
    import importlib
    import pkgutil

    import akocore.schemes
    from akocore.schemes.base import SchemeNode

    for info in pkgutil.iter_modules(akocore.schemes.__path__):
        importlib.import_module(f"akocore.schemes.{info.name}")
    found: set[str] = set()
    todo = list(SchemeNode.__subclasses__())
    while todo:
        cls = todo.pop()
        if cls.__name__ not in found:
            found.add(cls.__name__)
            todo.extend(cls.__subclasses__())
    return found


def _class_names(node: ast.expr) -> list[str]:
    """The class names an isinstance's second argument names (a name, an attribute, a
    tuple of them, or a union A | B)."""
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        return [node.attr]
    if isinstance(node, ast.Tuple):
        return [name for item in node.elts for name in _class_names(item)]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _class_names(node.left) + _class_names(node.right)
    return []


def node_class_checks(tree: ast.AST, classes: set[str]) -> list[int]:
    """Lines that check a value against one of `classes`: ``isinstance(x, C)``,
    ``issubclass(t, (A, B))``, ``isinstance(x, A | B)``, ``type(x) is C``."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in ("isinstance", "issubclass") and len(node.args) == 2:
            if classes & set(_class_names(node.args[1])):
                lines.append(node.lineno)
        elif isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            typed = any(isinstance(item, ast.Call) and isinstance(item.func, ast.Name)
                        and item.func.id == "type" for item in operands)
            if typed and any(classes & set(_class_names(item)) for item in operands
                             if not isinstance(item, ast.Call)):
                lines.append(node.lineno)
    return lines


def test_the_node_class_check_finder_finds_the_forms_it_forbids():
    classes = {"AkoWorker", "PSServer"}
    source = ("a = isinstance(node, AkoWorker)\nb = isinstance(n, (int, schemes.PSServer))\n"
              "c = issubclass(t, AkoWorker | PSServer)\nd = type(node) is AkoWorker\n"
              "e = isinstance(node, SchemeNode)\nf = isinstance(node, Recoverable)\n"
              "g = type(node) == int\n")
    assert node_class_checks(ast.parse(source), classes) == [1, 2, 3, 4]


def test_the_concrete_scheme_node_classes_are_found():
    classes = _scheme_node_classes()
    assert {"AkoWorker", "PSServer", "PSWorker", "DilocoWorker", "ElasticServer"} <= classes
    assert "SchemeNode" not in classes and "Recoverable" not in classes


def test_no_module_checks_a_scheme_node_class_outside_the_schemes():
    """Shells ask a node for a capability (akocore.schemes.recovery: `delivery`,
    `recovery`, `resync`; the role's recovery in akorun), never for its class."""
    classes = _scheme_node_classes()
    assert offending_lines(lambda tree: node_class_checks(tree, classes),
                           NODE_CLASS_CHECKS_ALLOWED) == []


# ------------------------------------------------------------ one application layer

APPLICATION_LAYER = "akosim.planning"
# constructors of a simulation's pieces: only the application layer calls them (and the
# simulation itself, inside akosim.sim.scenario)
SETUP_CONSTRUCTORS = {"Setup": APPLICATION_LAYER, "StopRule": APPLICATION_LAYER,
                      "ComputeModel": APPLICATION_LAYER, "Simulation": "akosim.sim.scenario"}


def test_only_the_application_layer_builds_a_simulation_setup():
    offenders = []
    for module, path in project_modules().items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            home = SETUP_CONSTRUCTORS.get(_called_name(node))
            if home is not None and not (module == home or module.startswith(home + ".")):
                offenders.append(f"{module}:{node.lineno} calls {_called_name(node)}")
    assert offenders == []


@pytest.mark.parametrize("entry_point", ["akosim.cli", "akosim.sweeping.sweep_grid",
                                         "akosim.prediction",
                                         "analysis.akosim_calls"])
def test_every_entry_point_uses_the_application_layer(entry_point):
    graph = import_graph()
    assert any(t == APPLICATION_LAYER or t.startswith(APPLICATION_LAYER + ".")
               for t in graph[entry_point]), f"{entry_point} does not use {APPLICATION_LAYER}"


def _runs_akosim_executable(call: ast.Call) -> bool:
    """subprocess.X(["akosim", ...]) or ([sys.executable, "-m", "akosim", ...]), or a helper
    that builds such a command from "akosim" as its first argument."""
    first = call.args[0] if call.args else None
    launcher = re.search(r"python|run|popen|exec|call|command", _called_name(call), re.I)
    if launcher and isinstance(first, ast.Constant) and first.value == "akosim":
        return True
    func = call.func
    if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
            and func.value.id == "subprocess"):
        return False
    if not call.args or not isinstance(call.args[0], ast.List | ast.Tuple):
        return False
    words = [e.value for e in call.args[0].elts[:3] if isinstance(e, ast.Constant)]
    return "akosim" in words


def test_no_module_runs_akosim_as_a_subprocess():
    offenders = []
    for module, path in project_modules().items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        offenders += [f"{module}:{node.lineno}" for node in ast.walk(tree)
                      if isinstance(node, ast.Call) and _runs_akosim_executable(node)]
    assert offenders == []


# ------------------------------------------------------------ modules and names

LONG_MODULE_LINES = 500


def test_a_module_past_500_lines_says_why_in_its_docstring():
    offenders = []
    for module, path in project_modules().items():
        text = path.read_text(encoding="utf-8")
        if text.count("\n") <= LONG_MODULE_LINES:
            continue
        doc = ast.get_docstring(ast.parse(text)) or ""
        if not re.search(r"(past|over) ~?500 lines", doc, re.IGNORECASE):
            offenders.append(module)
    assert offenders == []


def test_no_two_modules_share_a_file_name():
    """A module's file name says what it is: no twins in different packages (entry
    points __init__ and __main__ aside)."""
    seen: dict[str, list[str]] = {}
    for module, path in project_modules().items():
        if path.name in ("__init__.py", "__main__.py"):
            continue
        seen.setdefault(path.name, []).append(module)
    twins = {name: modules for name, modules in seen.items() if len(modules) > 1}
    assert twins == {}


def test_a_new_scheme_is_one_module_and_one_registry_entry(monkeypatch, capsys):
    """A scheme written against the protocol runs in akosim with nothing else changed:
    the settings accept its name, the plan simulates it, the tables name it."""
    from types import MappingProxyType

    from akocore.schemes import Scheme, SchemeError, SchemeNode, registry
    from akosim.cli import main

    class SoloWorker(SchemeNode):  # trains alone: nothing is exchanged
        def local_step(self, round_, grad):
            self._check_round(round_)
            self._check_grad(grad)
            if grad is not None:
                self.replica.apply(grad)
            self.next_round += 1
            return []

        def receive(self, msg):
            raise SchemeError("solo workers exchange nothing")

    class SoloScheme(Scheme):
        name = "solo"
        summary = "every worker trains alone"

        def build(self, spec, length, params0, replica):
            return [SoloWorker(i, length, replica(i, params0)) for i in range(spec.workers)]

    monkeypatch.setattr(registry, "REGISTRY",
                        MappingProxyType({**registry.REGISTRY, "solo": SoloScheme()}))
    assert main(["--set", "exchange.scheme=solo", "--workers", "3", "--gradient-size", "40KB",
                 "--compute", "10ms", "--rounds", "5", "--quiet"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines()
               if line.startswith("solo"))
    assert "10 ms" in row and " 0 B" in row  # compute alone, nothing sent
