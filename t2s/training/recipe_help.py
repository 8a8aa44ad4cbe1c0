"""What ``t2s train --help`` lists after its own options: every key the shipped recipes set, grouped as the recipe
files group them (their ``# ---- model``, ``# ---- data``, ... headers), then t2s's own keys that no shipped recipe
sets (``OWN_KEYS_GROUP``: the engine, a chat template, ...), each with its help and default from the dataclasses a
recipe is parsed into (``t2s.training.configs``).

The dataclasses are read as source (``ast``), never imported: ``trl.GRPOConfig`` builds on transformers'
``TrainingArguments``, whose module imports torch, and help must not wait seconds for it. ``DATACLASS_SOURCES`` names
where each one is defined, base classes before the classes built on them; the tests check that what is read here is
what the imported dataclasses hold.
"""

from __future__ import annotations

import ast
import importlib.util
import textwrap
from pathlib import Path

RECIPE_ORDER = ("bird.yaml",)  # read first: its groups and keys set the order
OTHER_GROUP = "other"
OWN_KEYS_GROUP = "t2s keys no shipped recipe sets"
# (package, file in it, class): the recipe's dataclasses and their bases; a later class's field wins
DATACLASS_SOURCES = (
    ("trl", "trainer/model_config.py", "ModelConfig"),
    ("transformers", "training_args.py", "TrainingArguments"),
    ("trl", "trainer/base_config.py", "_BaseConfig"),
    ("trl", "trainer/grpo_config.py", "GRPOConfig"),
    ("t2s", "training/configs.py", "T2SGRPOConfig"),
    ("t2s", "training/configs.py", "T2SScriptArguments"),
)
FACTORIES = {"list": [], "dict": {}, "tuple": (), "set": set()}


def train_recipes() -> list:
    """The shipped recipes/*.yaml that ``train`` takes: all but the warm-start recipes of ``t2s sft`` (those naming an
    ``rl_recipe``)."""
    from t2s.settings import shipped

    return [path for path in shipped("recipes").glob("*.yaml")
            if not any(line.startswith("rl_recipe:") for line in path.read_text(encoding="utf-8").splitlines())]


def recipe_groups() -> dict[str, list[str]]:
    """{group: [keys in first-seen order]} over the shipped recipes ``train`` takes."""
    files = sorted(train_recipes(), key=lambda p: (p.name not in RECIPE_ORDER, p.name))
    groups: dict[str, list[str]] = {}
    seen: set[str] = set()
    for path in files:
        group = OTHER_GROUP
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.startswith("# ----"):
                group = line.lstrip("# -").split(" (")[0].split(":")[0].strip() or OTHER_GROUP  # "environment: ..."
                continue
            if not line or line[0] in "# -" or ":" not in line:
                continue
            key = line.split(":", 1)[0].strip()
            if key.isidentifier() and key not in seen:
                seen.add(key)
                groups.setdefault(group, []).append(key)
    return groups


# A default written as ``<name>.<field>`` is that dataclass's own default: (package, file, class) of each such name
# (``T2SGRPOConfig``'s episode settings are ``_EPISODE.max_turns``, ..., ``EpisodeConfig``'s defaults).
DEFAULT_HOLDERS = {"_EPISODE": ("t2s", "env/episode.py", "EpisodeConfig")}


def _value(node):
    """A default as Python reads it where it is a literal (or another dataclass's default, ``DEFAULT_HOLDERS``), else
    its source text."""
    if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in DEFAULT_HOLDERS):
        package, file, class_name = DEFAULT_HOLDERS[node.value.id]
        return class_fields(_package_folder(package) / file, class_name)[node.attr][0]
    try:
        return ast.literal_eval(node)
    except ValueError:
        return ast.unparse(node)


def _field_default_and_help(node) -> tuple[object, str]:
    """(default, help) of one annotated class attribute's value: ``field(default=..., metadata={"help": ...})``, a
    ``default_factory``, or a plain default."""
    if not (isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "field"):
        return _value(node), ""
    default, help_text = None, ""
    for keyword in node.keywords:
        if keyword.arg == "default":
            default = _value(keyword.value)
        elif keyword.arg == "default_factory":
            factory = keyword.value
            if isinstance(factory, ast.Name) and factory.id in FACTORIES:
                default = FACTORIES[factory.id]
            else:
                default = _value(factory.body) if isinstance(factory, ast.Lambda) else ast.unparse(factory) + "()"
        elif keyword.arg == "metadata" and isinstance(keyword.value, ast.Dict):
            for key, value in zip(keyword.value.keys, keyword.value.values):
                if isinstance(key, ast.Constant) and key.value == "help":
                    help_text = value.value if isinstance(value, ast.Constant) else ast.unparse(value)
    return default, str(help_text)


def class_fields(path: Path, class_name: str) -> dict[str, tuple[object, str]]:
    """{field: (default, help)} of the dataclass ``class_name`` defined in the Python file ``path`` (its own fields)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = next((node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == class_name), None)
    if found is None:
        raise LookupError(f"no class {class_name} in {path}")
    fields = {}
    for statement in found.body:
        if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
            fields[statement.target.id] = (_field_default_and_help(statement.value) if statement.value is not None
                                           else (None, ""))
    return fields


def _package_folder(package: str) -> Path:
    spec = importlib.util.find_spec(package)  # a top-level package is found without being imported
    if spec is None or not spec.submodule_search_locations:
        raise LookupError(f"package {package} is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


def recipe_fields() -> dict[str, tuple[object, str]]:
    """{key: (default, help)} of every field a recipe may set, read from ``DATACLASS_SOURCES``."""
    found: dict[str, tuple[object, str]] = {}
    for package, file, class_name in DATACLASS_SOURCES:
        found.update(class_fields(_package_folder(package) / file, class_name))
    return found


def own_fields() -> list[str]:
    """The fields t2s's own dataclasses define (``DATACLASS_SOURCES`` in package ``t2s``: the keys they add and the
    GRPOConfig fields they redefine, such as ``loss_type``), in definition order."""
    keys: dict[str, None] = {}
    for package, file, class_name in DATACLASS_SOURCES:
        if package == "t2s":
            keys.update(dict.fromkeys(class_fields(_package_folder(package) / file, class_name)))
    return list(keys)


def recipe_keys_help(width: int = 100) -> str:
    """The help text of every recipe key (see the module docstring)."""
    fields = recipe_fields()
    out = ["recipe keys: set in the --config YAML (the names below with underscores: max_turns), or override one",
           "on the command line (--max-turns 4; --max_turns works too). Any other GRPOConfig field works as well."]
    groups = recipe_groups()
    listed = {key for keys in groups.values() for key in keys}
    unset = [key for key in own_fields() if key not in listed]
    for group, keys in [*groups.items(), *([(OWN_KEYS_GROUP, unset)] if unset else [])]:
        out.append("")
        out.append(f"{group}:")
        for key in keys:
            default, help_text = fields.get(key, (None, ""))
            help_text = " ".join(help_text.split())
            out.append(f"  --{key.replace('_', '-')} (default: {default})")
            if help_text:
                out += textwrap.wrap(help_text, width=width, initial_indent=" " * 6, subsequent_indent=" " * 6)
    return "\n".join(out) + "\n"
