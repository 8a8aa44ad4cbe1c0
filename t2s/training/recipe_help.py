"""What ``t2s train --help`` lists after its own options: every key the shipped recipes set, grouped as the recipe
files group them (their ``# ---- model``, ``# ---- data``, ... headers), each with its help and default from the
dataclasses a recipe is parsed into (``t2s.training.configs``)."""

from __future__ import annotations

import dataclasses
import textwrap

RECIPE_ORDER = ("bird.yaml",)  # read first: its groups and keys set the order
OTHER_GROUP = "other"


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
                group = line.lstrip("# -").split(" (")[0].strip() or OTHER_GROUP
                continue
            if not line or line[0] in "# -" or ":" not in line:
                continue
            key = line.split(":", 1)[0].strip()
            if key.isidentifier() and key not in seen:
                seen.add(key)
                groups.setdefault(group, []).append(key)
    return groups


def _fields() -> dict[str, dataclasses.Field]:
    from trl import ModelConfig

    from t2s.training.configs import T2SGRPOConfig, T2SScriptArguments

    found: dict[str, dataclasses.Field] = {}
    for kind in (ModelConfig, T2SGRPOConfig, T2SScriptArguments):  # later kinds win: t2s's own help text
        found.update({f.name: f for f in dataclasses.fields(kind)})
    return found


def _default(spec: dataclasses.Field):
    if spec.default is not dataclasses.MISSING:
        return spec.default
    if spec.default_factory is not dataclasses.MISSING:
        return spec.default_factory()
    return None


def recipe_keys_help(width: int = 100) -> str:
    """The help text of every recipe key (see the module docstring)."""
    fields = _fields()
    out = ["recipe keys: set in the --config YAML (the names below with underscores: max_turns), or override one",
           "on the command line (--max-turns 4; --max_turns works too). Any other GRPOConfig field works as well."]
    for group, keys in recipe_groups().items():
        out.append("")
        out.append(f"{group}:")
        for key in keys:
            spec = fields.get(key)
            help_text = " ".join(str(spec.metadata.get("help") or "").split()) if spec else ""
            default = _default(spec) if spec else None
            out.append(f"  --{key.replace('_', '-')} (default: {default})")
            if help_text:
                out += textwrap.wrap(help_text, width=width, initial_indent=" " * 6, subsequent_indent=" " * 6)
    return "\n".join(out) + "\n"
