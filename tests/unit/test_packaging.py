"""Packaging contracts: setup.py's ranges and the lock files agree, Docker and CI install with the lock files, README
and CI run the same commands, the CLI is frozen, and the commands the README, the docs/ guides and the benchmark
READMEs quote are real (flags the command has, modules of this checkout, links to files)."""

from __future__ import annotations

import ast
import importlib.util
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from zero_kit.cli import COMMANDS, build_parser

ROOT = Path(__file__).resolve().parents[2]


# The libraries whose config schemas and behaviour zero_kit depends on: the oldest lock pins exactly their lower
# bound, so CI's compatibility job tests the oldest release that setup.py admits.
SCHEMA_LIBS = ("deepspeed", "transformers", "accelerate", "peft", "datasets")


def _setup_requires() -> dict[str, SpecifierSet]:
    tree = ast.parse((ROOT / "setup.py").read_text())
    node = next(n for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "REQUIRES")
    return {canonicalize_name(name): SpecifierSet(spec) for name, spec in ast.literal_eval(node.value).items()}


def _lock(name: str) -> dict[str, Version]:
    """constraints/NAME.txt as {package: version}; every line is a comment or an exact pin."""
    pins = {}
    for line in (ROOT / "constraints" / f"{name}.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            package, version = line.split("==")
            pins[canonicalize_name(package)] = Version(version)
    return pins


def _lower_bound(spec: SpecifierSet) -> Version:
    return next(Version(s.version) for s in spec if s.operator == ">=")


@pytest.mark.parametrize("lock", ["oldest", "newest"])
def test_every_lock_file_satisfies_setup_ranges(lock):
    requires, pins = _setup_requires(), _lock(lock)
    assert "torch" not in pins, "torch stays out of the lock files: CPU and CUDA builds are installed apart"
    missing = sorted(set(requires) - set(pins) - {"torch"})
    assert not missing, f"constraints/{lock}.txt pins no version of {missing}"
    outside = {name: str(pins[name]) for name, spec in requires.items() if name in pins and pins[name] not in spec}
    assert not outside, f"constraints/{lock}.txt is outside setup.py's ranges: {outside}"


def test_oldest_lock_pins_the_lower_bounds():
    requires, oldest, newest = _setup_requires(), _lock("oldest"), _lock("newest")
    for name in SCHEMA_LIBS:
        assert oldest[name] == _lower_bound(requires[name]), f"{name}: oldest.txt must pin setup.py's lower bound"
        assert oldest[name] < newest[name], f"{name}: the two lock files test one version only"


def test_docker_and_ci_install_with_the_lock_files():
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    assert "COPY constraints ./constraints" in dockerfile
    installs = [line for line in dockerfile.splitlines() if "pip install" in line]
    assert installs and all("-c constraints/newest.txt" in line for line in installs), installs
    torch_base = Version(re.search(r"FROM pytorch/pytorch:([\d.]+)-", dockerfile).group(1))
    assert torch_base in _setup_requires()["torch"], "the image's torch is outside setup.py's range"
    ci = (ROOT / ".ci" / "run").read_text()
    assert "-c constraints/newest.txt" in ci and "-c constraints/oldest.txt" in ci


def _readme_block(heading: str) -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme.split(heading, 1)[1]
    return re.search(r"```(?:bash|sh)?\n(.*?)```", section, re.S).group(1).strip()


def test_ci_runs_the_readme_commands_word_for_word():
    ci = (ROOT / ".ci" / "run").read_text()
    install = _readme_block("## Quick start")
    first_line = install.splitlines()[0]
    assert first_line.split(" && zero-kit")[0] in ci, "CI must install exactly as the README says"
    assert "pip install torch==2.13.0" in first_line, "the README must pin the CPU torch build"
    tests = _readme_block("### Tests")
    assert tests in ci, "CI must run the README's test command"


# Freeze the public CLI (torchtitan's test_no_new_cli_options): a change here is a conscious one.
FROZEN = {
    "config": {
        "--stage",
        "--offload-optimizer",
        "--offload-param",
        "--nvme-path",
        "--precision",
        "--micro-batch",
        "--grad-accum",
        "--world-size",
        "--nodes",
        "--gpus-per-node",
        "--global-batch",
        "--model",
        "--hidden-size",
        "--hf-auto",
        "--accelerate-yaml",
        "-o",
    },
    "validate": {"--world-size", "--for", "--json"},
    "plan": {
        "--model",
        "--params",
        "--hidden-size",
        "--layers",
        "--heads",
        "--vocab",
        "--gpu-mem",
        "--gpus-per-node",
        "--nodes",
        "--host-mem",
        "--seq-len",
        "--micro-batch",
        "--lora-r",
        "--activation-checkpointing",
        "--json",
        "-o",
    },
    "train": {
        "--model",
        "--data",
        "--format",
        "--ds-config",
        "--stage",
        "--lora-r",
        "--output",
        "--max-steps",
        "--save-steps",
        "--resume",
        "--nproc",
    },
    "export": {"--out"},
    "bench": {"--strategies", "--nproc", "--model", "--steps", "--precision", "--out"},
    "launch": {"--hostfile", "--slurm"},
    "ops": {"--op"},
}


def _flags(name: str) -> set[str]:
    parser = build_parser(name)
    sub = next(a for a in parser._actions if a.dest == "command").choices[name]
    return {opt for action in sub._actions for opt in action.option_strings}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_design_contract_flags_exist(name):
    missing = FROZEN[name] - _flags(name)
    assert not missing, f"zero-kit {name} lost contract flags {sorted(missing)} (see shared/DESIGN.md)"


FLAGS_FILE = Path(__file__).with_name("cli_flags.json")


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_cli_is_frozen_exactly(name):
    """Every flag of every command is listed in cli_flags.json: an added flag fails as surely as a lost one, so
    a change to the CLI is a conscious one (edit the file in the same commit)."""
    import json

    frozen = set(json.loads(FLAGS_FILE.read_text())[name])
    now = _flags(name)
    assert now == frozen, f"zero-kit {name}: added {sorted(now - frozen)}, lost {sorted(frozen - now)} ({FLAGS_FILE})"


def test_console_script_runs():
    out = subprocess.run(
        [sys.executable, "-m", "zero_kit.cli", "--version"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0 and out.stdout.startswith("zero-kit ")


def test_launcher_local_rank_is_accepted_anywhere(monkeypatch):
    from zero_kit.cli import strip_local_rank

    monkeypatch.setenv("LOCAL_RANK", "")  # registers the undo, so the value set below never leaks to other tests
    monkeypatch.delenv("LOCAL_RANK")
    assert strip_local_rank(["--local_rank=1", "train", "--max-steps", "2"]) == ["train", "--max-steps", "2"]
    import os

    assert os.environ["LOCAL_RANK"] == "1"
    assert strip_local_rank(["config", "--local-rank", "0", "--stage", "3"]) == ["config", "--stage", "3"]


def test_ci_installs_every_debian_package_the_rigs_need():
    from tests.rigs import apt_packages

    ci = (Path(__file__).resolve().parents[2] / ".ci" / "run").read_text()
    line = next(line for line in ci.splitlines() if "apt-get install" in line)
    assert set(apt_packages()) <= set(line.split()), f"{sorted(set(apt_packages()) - set(line.split()))} missing"


def test_no_two_test_modules_share_a_basename():
    """tests/ has no __init__.py files: pytest imports test modules by basename, and a second module with the same
    name stops the whole collection ("import file mismatch")."""
    from collections import Counter

    names = Counter(p.name for p in (Path(__file__).resolve().parents[1]).rglob("test_*.py"))
    assert not [n for n, k in names.items() if k > 1], names.most_common(3)


# The README and the guides quote commands: each quote is kept true here.
DOCS = sorted(
    {ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "benchmarks").glob("**/README.md")}
    - set((ROOT / "benchmarks").glob("**/results*/**/README.md"))
)
CLI = re.compile(r"(?:zero-kit|-m zero_kit\.cli|--module zero_kit\.cli) (.*)")


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _code(text: str) -> list[str]:
    """What a reader would copy: lines of fenced or indented code blocks and inline `code` spans, with shell
    line continuations joined and comments dropped."""
    spans, fenced = [], False
    for line in text.replace("\\\n", " ").splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif fenced and line.startswith("$ "):
            continue  # a session: tests/unit/test_docs.py runs it and compares its output (a mistyped flag on purpose)
        elif fenced or line.startswith("    "):
            spans.append(line.split(" #", 1)[0])
        else:
            spans += re.findall(r"`([^`]+)`", line)
    return spans


def _unknown_flags(argv: list[str]) -> list[str]:
    """Flags in `COMMAND ARGS` (and after a bare `--` that starts another command) the command does not have."""
    if not argv or argv[0] not in COMMANDS:
        return []
    known, rest = _flags(argv[0]), argv[1:]
    cut = rest.index("--") if "--" in rest else len(rest)
    unknown = [f"{argv[0]} {t}" for t in rest[:cut] if t.startswith("-") and t.split("=")[0] not in known]
    return unknown + _unknown_flags(rest[cut + 1 :])


@pytest.mark.parametrize("doc", DOCS, ids=_rel)
def test_quoted_zero_kit_commands_use_real_flags(doc):
    bad, seen = [], 0
    for span in _code(doc.read_text(encoding="utf-8")):
        for match in CLI.finditer(span):
            try:
                argv = shlex.split(match.group(1))
            except ValueError:
                argv = match.group(1).split()
            seen += argv[:1] != [] and argv[0] in COMMANDS
            bad += _unknown_flags(argv)
    assert not bad, f"{_rel(doc)} quotes flags zero-kit does not have: {bad}"
    if doc.name == "README.md" and doc.parent == ROOT:
        assert seen >= len(COMMANDS), "the README quotes every command"


@pytest.mark.parametrize("doc", DOCS, ids=_rel)
def test_quoted_python_modules_exist(doc):
    modules = {m for span in _code(doc.read_text(encoding="utf-8")) for m in re.findall(r"-m ([\w.]+)", span)}
    # a placeholder such as "benchmarks.<study>.<script>" leaves "benchmarks.": not a module name
    tops = {"zero_kit", "benchmarks", "scripts", "tests"}
    ours = sorted(m for m in modules if m.split(".")[0] in tops and m[-1] != ".")
    missing = [m for m in ours if importlib.util.find_spec(m) is None]
    assert not missing, f"{_rel(doc)} runs modules that do not exist: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=_rel)
def test_relative_links_point_at_files(doc):
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text(encoding="utf-8"))
    missing = [link for link in links if "://" not in link and not (doc.parent / link).exists()]
    assert not missing, f"{_rel(doc)} links to missing files: {missing}"


PATH = re.compile(
    r"(?<![\w./-])((?:benchmarks|tests|docs|zero_kit|scripts|ds_configs|constraints|docker)/[\w./-]*[\w/])"
)


@pytest.mark.parametrize("doc", DOCS, ids=_rel)
def test_quoted_repository_paths_exist(doc):
    """A path into the repository names a file or folder that is there (or a results folder a command writes)."""
    paths = set(PATH.findall(doc.read_text(encoding="utf-8")))
    missing = sorted(p for p in paths if not (ROOT / p).exists() and not Path(p).name.startswith("results"))
    assert not missing, f"{_rel(doc)} names paths that do not exist: {missing}"


def test_every_study_has_a_readme_in_the_index():
    index = (ROOT / "benchmarks" / "README.md").read_text(encoding="utf-8")
    studies = [p.parent.name for p in (ROOT / "benchmarks").glob("*/run.py")]
    assert studies, "no studies found"
    for name in studies:
        assert (ROOT / "benchmarks" / name / "README.md").is_file(), f"benchmarks/{name} has no README.md"
        assert f"]({name}/README.md)" in index, f"benchmarks/README.md does not list {name}"
