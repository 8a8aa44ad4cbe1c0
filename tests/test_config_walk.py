"""Where an eval's configuration travels: a static walk from ``t2s.evaluation.runner.evaluate`` (docs/design.md,
"The evaluation configuration's way").

The walk reads the sources with ``ast`` and follows the configuration records (``EvalConfig`` and the records it holds:
``PolicyConfig``, ``EndpointConfig``, ``EpisodeConfig``, ``SamplingSettings``) the way a reader would:

- it starts in ``evaluate`` with its ``config`` parameter, an ``EvalConfig``;
- a *part* is an expression whose value is one of those records, read from the field and return annotations of their
  classes: a name bound to one, a record-typed field of a part (``config.policy.episode``), a method of a part that
  returns a record (``policy.episode_for(mode)``), a local assigned from a part, or an attribute of ``self`` that a
  method set from a part (``self.config``). Plain values taken from a record (a path, a number) are not parts: passing
  those down is the explicit style the layout asks for;
- a call that passes a part (positionally or by keyword) is followed into the function or method it names, when that
  is in ``t2s`` and can be named statically (a module function, an imported name, ``self.method``, a method of a
  local built from a ``t2s`` class); a class called with a part is followed into its ``__init__``, and a method later
  called on that instance carries the attributes it set;
- each function is visited once, in the order its calls appear.

The *way* is the modules of the visited functions in that order, with consecutive visits to one module merged into
one stay. It *climbs* where a stay is in a higher layer than the one before it (``tests/test_layout.py``'s LAYERS),
and *returns* where a stay is in a module the way had left.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from test_layout import MODULES, RANK, _top

START = ("t2s.evaluation.runner", "evaluate", {"config": "EvalConfig"})
MAX_CLIMBS, MAX_RETURNS = 3, 8


@dataclass
class _Module:
    name: str
    functions: dict[str, ast.FunctionDef] = field(default_factory=dict)  # "f" or "Class.f"
    classes: set[str] = field(default_factory=set)
    imports: dict[str, str] = field(default_factory=dict)  # local name -> "module" or "module.attr"


def _index(name: str) -> _Module:
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8"))
    module = _Module(name)
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            module.functions[node.name] = node
        elif isinstance(node, ast.ClassDef):
            module.classes.add(node.name)
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    module.functions[f"{node.name}.{item.name}"] = item
    for node in ast.walk(tree):  # imports inside functions count
        if isinstance(node, ast.Import):
            for alias in node.names:
                module.imports[alias.asname or alias.name.partition(".")[0]] = alias.name if alias.asname else \
                    alias.name.partition(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                module.imports[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return module


INDEX = {name: _index(name) for name in MODULES}
#: method name -> every (module, "Class.method") that defines it; a method of an unknown receiver is followed when
#: its name is defined once
METHODS: dict[str, list[tuple[str, str]]] = {}
for _name, _module in INDEX.items():
    for _qualname in _module.functions:
        if "." in _qualname:
            METHODS.setdefault(_qualname.split(".")[1], []).append((_name, _qualname))


def _definition(target: str, depth: int = 0) -> tuple[str, str] | None:
    """``module.attr`` -> (module, "attr") where attr is a function or class defined there (re-exports followed)."""
    module, _, attr = target.rpartition(".")
    if module not in INDEX or depth > 4:
        return None
    found = INDEX[module]
    if attr in found.functions or attr in found.classes:
        return module, attr
    if attr in found.imports:
        return _definition(found.imports[attr], depth + 1)
    return None


def _callable(module: str, name: str) -> tuple[str, str] | None:
    """What a bare name called in ``module`` is: (module, "f") or (module, "Class") of a ``t2s`` definition."""
    found = INDEX[module]
    if name in found.functions or name in found.classes:
        return module, name
    if name in found.imports:
        return _definition(found.imports[name])
    return None


RECORDS = {"EvalConfig": "t2s.evaluation.config", "PolicyConfig": "t2s.evaluation.config",
           "EndpointConfig": "t2s.evaluation.config", "EpisodeConfig": "t2s.env.episode",
           "SamplingSettings": "t2s.backends.base"}


def _record_of(annotation: ast.AST | None) -> str | None:
    """The record an annotation names (``PolicyConfig``, ``EpisodeConfig | None``), else None."""
    if annotation is None:
        return None
    text = ast.unparse(annotation).strip("'\"")
    return next((name for name in (part.strip() for part in text.split("|")) if name in RECORDS), None)


def _record_types() -> tuple[dict[str, dict[str, str]], dict[str, dict[str, str]]]:
    """For each record: its record-typed fields and its methods that return a record."""
    fields, returns = {}, {}
    for record, module in RECORDS.items():
        tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
        body = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == record).body
        fields[record] = {node.target.id: found for node in body if isinstance(node, ast.AnnAssign)
                          and isinstance(node.target, ast.Name) and (found := _record_of(node.annotation))}
        returns[record] = {node.name: found for node in body if isinstance(node, ast.FunctionDef)
                           and (found := _record_of(node.returns))}
    return fields, returns


FIELDS, RETURNS = _record_types()


class Walk:
    def __init__(self) -> None:
        self.visited: set[tuple[str, str]] = set()
        self.order: list[tuple[str, str]] = []
        self.held: dict[tuple[str, str], dict[str, str]] = {}  # (module, class) -> {attribute of self: record}

    def run(self, module: str, qualname: str, parts: dict[str, str]) -> list[str]:
        self.visit(module, qualname, parts)
        way: list[str] = []
        for module, _ in self.order:
            if not way or way[-1] != module:
                way.append(module)
        return way

    def visit(self, module: str, qualname: str, parts: dict[str, str]) -> None:
        if (module, qualname) in self.visited or qualname not in INDEX[module].functions:
            return
        self.visited.add((module, qualname))
        self.order.append((module, qualname))
        function = INDEX[module].functions[qualname]
        cls = qualname.split(".")[0] if "." in qualname else None
        parts = dict(parts)  # name -> a record's name, or the (module, class) of an instance that holds parts
        held = self.held.setdefault((module, cls), {}) if cls else {}

        def record(node: ast.AST) -> str | None:
            """The record ``node``'s value is, when it is a part."""
            if isinstance(node, ast.Name):
                if node.id == "self" and cls and held:
                    return module, cls
                return parts.get(node.id)
            if isinstance(node, ast.Attribute):
                if isinstance(node.value, ast.Name) and node.value.id == "self" and cls:
                    return held.get(node.attr)
                owner = record(node.value)
                if isinstance(owner, tuple):
                    return self.held.get(owner, {}).get(node.attr)
                return FIELDS[owner].get(node.attr) if isinstance(owner, str) else None
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                owner = record(node.func.value)
                if isinstance(owner, str):
                    return RETURNS[owner].get(node.func.attr)
            if isinstance(node, ast.Call) and any(map(record, [*node.args, *(kw.value for kw in node.keywords)])):
                callee, _ = self.callee(module, cls, node.func, parts)  # a function that returns a record it took
                if callee and (found := INDEX[callee[0]].functions.get(callee[1])) is not None:
                    return _record_of(found.returns)
            if isinstance(node, ast.BoolOp):
                return next(filter(None, map(record, node.values)), None)
            return None

        nodes = sorted((n for n in ast.walk(function) if hasattr(n, "lineno")), key=lambda n: (n.lineno, n.col_offset))
        for _ in range(2):  # parts assigned from parts, in any order
            for node in nodes:
                if isinstance(node, ast.Assign) and (found := record(node.value)):
                    for target in node.targets:
                        if isinstance(target, ast.Name):
                            parts[target.id] = found
                        elif (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                              and target.value.id == "self" and cls):
                            held[target.attr] = found
        for node in nodes:
            if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                    and isinstance(node.value.func, ast.Name)):
                built = _callable(module, node.value.func.id)
                if built and built[1] in INDEX[built[0]].classes:
                    for target in node.targets:
                        if isinstance(target, ast.Name):
                            parts[target.id] = built
            if not isinstance(node, ast.Call):
                continue
            for arg in [*node.args, *(kw.value for kw in node.keywords)]:  # a method handed on: self._gold_record
                if (cls and held and isinstance(arg, ast.Attribute) and isinstance(arg.value, ast.Name)
                        and arg.value.id == "self" and f"{cls}.{arg.attr}" in INDEX[module].functions):
                    self.visit(module, f"{cls}.{arg.attr}", {})
            carried = {i: found for i, arg in enumerate(node.args) if (found := record(arg))}
            named = {kw.arg: found for kw in node.keywords if kw.arg and (found := record(kw.value))}
            callee, bound_self = self.callee(module, cls, node.func, parts)
            if isinstance(bound_self, tuple) and not self.held.get(bound_self):
                bound_self = None  # an instance that holds no part
            carried = {i: found for i, found in carried.items() if isinstance(found, str) or self.held.get(found)}
            named = {name: found for name, found in named.items() if isinstance(found, str) or self.held.get(found)}
            if callee is None or not (carried or named or bound_self):
                continue
            target_module, target_name = callee
            if target_name in INDEX[target_module].classes:
                target_name = f"{target_name}.__init__"
            if target_name not in INDEX[target_module].functions:
                continue
            params = [a.arg for a in INDEX[target_module].functions[target_name].args.args]
            if "." in target_name and params[:1] == ["self"]:
                params = params[1:]
            bound = {params[i]: found for i, found in carried.items() if i < len(params)} | named
            self.visit(target_module, target_name, bound)

    def callee(self, module, cls, func, parts):
        """(module, name) a call's function names, and the (module, class) whose held attributes it carries."""
        if isinstance(func, ast.Name):
            return _callable(module, func.id), None
        if not isinstance(func, ast.Attribute) or not isinstance(func.value, ast.Name):
            return None, None
        owner = func.value.id
        if owner == "self" and cls:
            name = f"{cls}.{func.attr}"
            return ((module, name) if name in INDEX[module].functions else None), (module, cls)
        if isinstance(parts.get(owner), tuple):
            built_module, built_class = parts[owner]
            name = f"{built_class}.{func.attr}"
            found = (built_module, name) if name in INDEX[built_module].functions else None
            return found, (built_module, built_class)
        target = INDEX[module].imports.get(owner)
        if target in INDEX:
            return _definition(f"{target}.{func.attr}"), None
        if len(METHODS.get(func.attr, [])) == 1 and owner not in INDEX[module].imports:
            return METHODS[func.attr][0], None
        return None, None


def climbs_and_returns(way: list[str]) -> tuple[int, int]:
    climbs = sum(RANK[_top(b)] > RANK[_top(a)] for a, b in zip(way, way[1:]))
    returns = sum(stay in way[:i] for i, stay in enumerate(way))
    return climbs, returns


def test_the_walk_counts_climbs_and_returns():
    way = ["t2s.evaluation.runner", "t2s.env.episode", "t2s.evaluation.policies", "t2s.env.episode",
           "t2s.evaluation.runner"]
    assert climbs_and_returns(way) == (2, 2)
    assert climbs_and_returns(["t2s.evaluation.runner", "t2s.rollout.driver", "t2s.env.episode"]) == (0, 0)


def test_the_walk_follows_parts_into_functions_and_held_attributes():
    visited = Walk()
    visited.run(*START)
    names = {f"{m}:{q}" for m, q in visited.visited}
    # evaluate -> Runner(config.policy) -> Runner.setup reads self.config; evaluate_mode takes the config itself
    assert "t2s.evaluation.policies:Runner.__init__" in names
    assert "t2s.evaluation.policies:Runner.setup" in names
    assert "t2s.evaluation.runner:evaluate_mode" in names


def test_the_eval_configuration_climbs_back_at_most_3_times_and_returns_at_most_8():
    way = Walk().run(*START)
    climbs, returns = climbs_and_returns(way)
    assert climbs <= MAX_CLIMBS, "\n".join(way)
    assert returns <= MAX_RETURNS, "\n".join(way)
    assert "t2s.rollout.driver" in way and "t2s.env.episode" in way  # the walk reaches the episode and the driver
