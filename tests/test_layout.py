"""The package's layout (README, Layout): packages by stage, imports that only go down, thin commands, small modules.

The import graph is read from the sources with ``ast``: imports inside functions count, and so does an
``importlib.import_module`` call that names a module in a string.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "t2s"

#: the top-level entries of ``t2s/`` by layer, lowest first; a module may import only from lower layers, from its own
#: package, or (in the foundation) from another foundation module
LAYERS: list[set[str]] = [
    {"errors", "settings", "ui", "run_lock"},
    {"env"},
    {"data", "scoring"},
    {"backends"},
    {"rollout"},
    {"training"},
    {"evaluation"},
    {"export"},
    {"bench"},
    {"commands"},
    {"__main__"},
]
RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}
#: one module per verb; ``t2s.commands`` itself is the dispatcher
VERBS = {"train", "sft", "eval", "score", "compare", "show", "ask", "export", "data", "bench", "demo"}
MAX_LINES = 450
#: modules allowed past MAX_LINES, each named with its reason in the README's Layout section
LONG_MODULES = {"t2s/data/demo.py"}


def _modules() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    return modules


MODULES = _modules()


def _known(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _targets(module: str, node: ast.AST) -> list[str]:
    names = []
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            package = module.split(".")
            if MODULES[module].name != "__init__.py":
                package = package[:-1]
            package = package[: len(package) - node.level + 1]
            base = ".".join(package + ([base] if base else []))
        names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
    elif (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module" and node.args
          and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
        names = [node.args[0].value]
    return [known for known in map(_known, names) if known and known.startswith("t2s")]


def import_graph() -> dict[str, set[str]]:
    graph = {}
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        graph[module] = {t for node in ast.walk(tree) for t in _targets(module, node) if t != module}
    return graph


GRAPH = import_graph()


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
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
    return found


def _top(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_the_checker_finds_cycles_and_upward_imports():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
    dynamic = ast.parse("import importlib\nimportlib.import_module('t2s.commands.train')").body[1].value
    assert _targets("t2s.env.tools", dynamic) == ["t2s.commands.train"]


def test_no_import_cycles():
    assert _cycles(GRAPH) == []


def test_every_top_level_entry_has_a_layer():
    entries = {p.stem if p.suffix == ".py" else p.name for p in PACKAGE.iterdir()
               if p.name != "__init__.py" and (p.suffix == ".py" or (p / "__init__.py").is_file())}
    assert entries <= set(RANK), f"place {sorted(entries - set(RANK))} in a layer"
    assert len(entries) + 1 <= 16, sorted(entries)  # + __init__.py: four foundation modules, a package per stage


def test_imports_only_go_down():
    upward = []
    for module, targets in GRAPH.items():
        if module == "t2s":
            continue
        for target in targets:
            a, b = _top(module), _top(target)
            if target == "t2s" or a == b or RANK[a] == RANK[b] == 0:  # the foundation modules form one layer
                continue
            if RANK[b] >= RANK[a]:
                upward.append(f"{module} -> {target}")
    assert upward == []


def test_commands_are_thin_verbs_that_import_no_other_command():
    commands = {m for m in MODULES if m.startswith("t2s.commands.")}
    assert {m.rpartition(".")[2] for m in commands} == VERBS
    offenders = [f"{m} -> {t}" for m in commands for t in GRAPH[m] if t.startswith("t2s.commands")]
    assert offenders == []
    library = [f"{m} -> {t}" for m in MODULES if not m.startswith("t2s.commands") and m != "t2s.__main__"
               for t in GRAPH[m] if t.startswith("t2s.commands")]
    assert library == []


def test_only_commands_and_ui_parse_the_command_line():
    """Below ``commands/`` (and the foundation's ``ui``, which holds the argument types), nothing imports argparse or
    takes a parsed namespace: commands build typed configs (``EvalConfig``, ``PolicyConfig``) and pass those down."""
    def imports_argparse(path: Path) -> bool:
        return any((isinstance(node, ast.Import) and any(a.name == "argparse" for a in node.names))
                   or (isinstance(node, ast.ImportFrom) and node.module == "argparse")
                   for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))))

    parsers = sorted(m for m, path in MODULES.items() if imports_argparse(path))
    assert "t2s.commands.eval" in parsers and all(m.startswith(("t2s.commands", "t2s.ui")) for m in parsers), parsers
    namespaces = [str(MODULES[m].relative_to(PACKAGE.parent)) for m in MODULES
                  if not m.startswith(("t2s.commands", "t2s.ui")) and "Namespace" in MODULES[m].read_text()]
    assert namespaces == []


def test_modules_stay_small():
    root = PACKAGE.parent
    long = {str(p.relative_to(root)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert set(long) <= LONG_MODULES, long
    readme = (root / "README.md").read_text(encoding="utf-8")
    layout = readme.split("## Layout", 1)[1].split("\n## ", 1)[0]
    for module in LONG_MODULES:
        assert module.removeprefix("t2s/") in layout, f"the README's Layout section names {module} and why"


def test_every_package_says_what_it_holds_and_may_import():
    for init in PACKAGE.glob("*/__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8")))
        assert doc and "import" in doc, f"{init}: the docstring says what the package holds and what it may import"


def test_every_module_imports_on_its_own():
    """Each module imports first, with no other t2s module loaded before it (one interpreter, t2s purged between)."""
    script = (
        "import importlib, sys\n"
        "failed = []\n"
        f"for name in {sorted(set(MODULES) - {'t2s.__main__'})!r}:\n"
        "    for loaded in [m for m in sys.modules if m == 't2s' or m.startswith('t2s.')]:\n"
        "        del sys.modules[loaded]\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except Exception as exc:\n"
        "        failed.append(f'{name}: {exc!r}')\n"
        "print('\\n'.join(failed))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=PACKAGE.parent)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == ""
