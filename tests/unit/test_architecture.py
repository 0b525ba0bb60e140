"""The package's structure, as docs/ARCHITECTURE.md draws it, checked from the code's own imports (every import,
also those inside functions): no import cycle between modules, no import that runs back up the layers, at most
ten modules directly in zero_kit/, no two modules of a folder named one letter apart, and no function over 60
lines. Files are cut by concept, not by length (docs/ARCHITECTURE.md, "One folder per concept")."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.support import docs

PACKAGE = Path(__file__).resolve().parents[2] / "zero_kit"
# Bottom to top: a unit may import units of its own layer or below, never above (cli and commands are the edge).
LAYERS = [
    {"errors", "dist", "log", "metrics", "options", "watchdog"},
    {"model", "launch", "lint", "data"},
    {"strategies", "config", "checkpoints"},
    {"plan", "export"},
    {"train", "bench"},
    {"hf"},
    {"commands"},
    {"cli", "__init__"},
]
# Pairs that stay apart although the layers would allow them: the linter judges any config and knows no strategy,
# the generator (config) knows no strategy either (strategies use it, not the other way round).
SAME_LAYER_FORBIDDEN = {
    ("train", "bench"),
    ("bench", "train"),
    ("lint", "strategies"),
    ("strategies", "lint"),
    ("config", "strategies"),
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """zero_kit modules `path` imports, as dotted names (a `from pkg import name` counts as pkg.name if that
    is a module, else as pkg)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "zero_kit"}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "zero_kit":
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                found.add(candidate if candidate in MODULES else node.module)
    return found


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
GRAPH = {name: _imports(path) - {name} for name, path in MODULES.items()}


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _layer(unit: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if unit in layer)


def test_every_unit_has_a_layer():
    units = {_unit(m) for m in MODULES}
    assert units <= set().union(*LAYERS), f"place {sorted(units - set().union(*LAYERS))} in LAYERS and the docs"


def test_no_import_runs_back_up_the_layers():
    upward = [
        f"{module} imports {target}"
        for module, targets in GRAPH.items()
        for target in targets
        if _unit(target) != _unit(module)
        and (_layer(_unit(target)) > _layer(_unit(module)) or (_unit(module), _unit(target)) in SAME_LAYER_FORBIDDEN)
        and not (_unit(module) == "__init__" or _unit(target) == "__init__" and target == "zero_kit")
    ]
    assert not upward, upward


def test_no_import_cycles():
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(GRAPH.get(node, ())):
            if nxt not in GRAPH:
                continue
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt, [*stack, nxt])
        state[node] = 2

    for module in sorted(GRAPH):
        if module not in state:
            visit(module, [module])
    assert not cycles, cycles


def test_a_package_imports_its_own_init_only_from_outside():
    """A subpackage's __init__ re-exports its public face; its own modules import each other directly, or the
    __init__ would run half-built (the way the old lint <-> lint_rules cycle was held open)."""
    inward = [
        f"{m} imports {t}"
        for m, targets in GRAPH.items()
        for t in targets
        if t.count(".") == 1 and m.startswith(t + ".") and MODULES[t].name == "__init__.py"
    ]
    assert not inward, inward


def test_at_most_ten_modules_directly_in_zero_kit():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= 10, top


def _folders() -> list[Path]:
    return sorted({p.parent for p in PACKAGE.rglob("*.py")})


def _one_letter_apart(a: str, b: str) -> bool:
    """Names one insertion, deletion or substitution apart (`resume` and `resumed`, `rule` and `rules`)."""
    if abs(len(a) - len(b)) > 1 or a == b:
        return False
    if len(a) == len(b):
        return sum(x != y for x, y in zip(a, b, strict=True)) == 1
    short, long = sorted((a, b), key=len)
    return any(long[:i] + long[i + 1 :] == short for i in range(len(long)))


def test_no_two_modules_of_a_folder_are_named_one_letter_apart():
    """Names say which: two modules whose names differ by one letter do different jobs under one name."""
    close = []
    for folder in _folders():
        names = sorted(p.stem for p in folder.glob("*.py") if p.stem != "__init__")
        close += [f"{folder.relative_to(PACKAGE)}: {a} / {b}" for i, a in enumerate(names) for b in names[i + 1 :]
                  if _one_letter_apart(a, b)]  # fmt: skip
    assert not close, close


def test_the_training_folder_reads_as_its_concepts():
    """train/ holds the run's story (options, plan, parent, rank, ...); its checks before the work are guards/,
    zero-kit's checkpoints and the export are packages of their own (docs/ARCHITECTURE.md)."""
    modules = sorted(p.name for p in (PACKAGE / "train").glob("*.py"))
    assert len(modules) <= 12, modules
    assert not any(name.startswith("export") for name in modules), modules


def _functions_over(limit: int) -> list[str]:
    """Every function or method in zero_kit/ longer than `limit` lines, from its `def` to its last line."""
    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = node.end_lineno - node.lineno + 1
                if length > limit:
                    long.append(f"{path.relative_to(PACKAGE.parent)}::{node.name} ({length} lines)")
    return long


def test_no_function_over_60_lines():
    long = _functions_over(60)
    assert not long, f"split by responsibility (house style: functions <= 60 lines): {long}"


def test_the_layout_in_architecture_md_names_what_is_there():
    """docs/ARCHITECTURE.md's tree (the block `covered layout`): every package and module of zero_kit/, every module
    and folder of train/ and of its sub-folders is named in it, and every folder it names exists."""
    tree = docs.covered("layout").text
    named = set(re.findall(r"\b\w+\b", tree))
    code = PACKAGE
    wanted = [p for p in code.iterdir() if (p / "__init__.py").is_file() or p.suffix == ".py"]
    wanted += [p for p in (code / "train").rglob("*") if (p.suffix == ".py" or (p / "__init__.py").is_file())]
    missing = sorted({str(p.relative_to(code)) for p in wanted if p.stem not in named and p.name != "__init__.py"})
    assert missing == [], f"not in docs/ARCHITECTURE.md's layout: {missing}"
    folders = re.findall(r"^\s*(\w+)/", tree, flags=re.MULTILINE)
    gone = [name for name in folders if not any((base / name).is_dir() for base in (code.parent, code, code / "train"))]
    assert gone == [], f"docs/ARCHITECTURE.md's layout names folders that are not there: {gone}"
