"""The docs do what they say: every code block of README.md and docs/*.md carries a marker (tests/support/docs.py)
and is checked by it. Quick commands run here as written, each doc file's blocks in order in a folder of their own
holding what the docs call `path/to/llama` (the embedded tiny LLaMA), `my.jsonl`, `pairs.jsonl` and `long.jsonl` (the
shipped data); their output is compared with the sample the doc shows. Launches are parsed by zero-kit's own parser
here and run by the test the marker names, which reads the command from the doc."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support import docs
from tests.support.jobs import VENV_BIN
from zero_kit.dist import free_port

ASSETS = docs.ROOT / "zero_kit" / "assets" / "data"
# What the docs call a user's files, made from the shipped data (each doc file's folder gets them).
DATA = {
    "my.jsonl": "alpaca.jsonl",
    "pairs.jsonl": "preference.jsonl",
    "long.jsonl": "text.jsonl",
    "long_rows.jsonl": "text.jsonl",
    "held_out.jsonl": "text.jsonl",
}
# A command of the docs may print this many FutureWarning lines at most (the first-run and docs issues' rule).
FUTURE_WARNINGS = 5
LAUNCHERS = ("deepspeed", "torchrun", "accelerate")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    from zero_kit.model import load_model, load_tokenizer

    folder = tmp_path_factory.mktemp("model")
    load_model().save_pretrained(folder)
    load_tokenizer().save_pretrained(folder)
    return folder


def _folder(tmp_path: Path, model: Path) -> Path:
    (tmp_path / "path" / "to").mkdir(parents=True)
    (tmp_path / "path" / "to" / "llama").symlink_to(model, target_is_directory=True)
    for name, asset in DATA.items():
        shutil.copyfile(ASSETS / asset, tmp_path / name)
    return tmp_path


def _run(line: str, cwd: Path, rank_of_one: bool = False) -> subprocess.CompletedProcess[str]:
    """LINE as bash runs it in CWD; RANK_OF_ONE: as the one rank a launcher starts (a snippet for a rank's script)."""
    env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}", "HF_HUB_OFFLINE": "1"}
    if rank_of_one:
        env.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    env.pop("ZERO_KIT_TEST_OPS_READY", None)
    return subprocess.run(
        ["bash", "-c", line], cwd=cwd, env=env, capture_output=True, text=True, timeout=180, check=False
    )


def test_every_block_has_a_marker_that_holds():
    problems = []
    for block in docs.all_blocks():
        words = block.arg.split()
        if block.kind in ("skip", "parse") and not block.arg:
            problems.append(f"{block.where}: `{block.kind}` needs its reason")
        if block.kind == "run" and docs.runs_first(block) is not None and len(words) < 2:
            problems.append(f"{block.where}: `run K` needs its reason")
        if block.kind == "covered":
            test = docs.ROOT / words[1] if len(words) == 2 else None
            if test is None or not test.is_file() or f'"{words[0]}"' not in test.read_text(encoding="utf-8"):
                problems.append(f"{block.where}: `covered ID TEST`: TEST must be a file that reads block ID")
        if block.kind == "excerpt":
            source = docs.ROOT / block.arg
            have = (
                {line.strip() for line in source.read_text(encoding="utf-8").splitlines()}
                if source.is_file()
                else set()
            )
            problems += [f"{block.where}: not in {block.arg}: {line.strip()}" for line in block.text.splitlines()
                         if line.strip() not in ("", "...") and line.strip() not in have]  # fmt: skip
        if block.kind in ("output", "shape") and not _after_run(block):
            problems.append(f"{block.where}: `{block.kind}` must follow a `run` block")
    assert not problems, "\n".join(problems)


def _after_run(block: docs.Block) -> bool:
    same = docs.blocks(block.path)
    earlier = [b for b in same if b.line < block.line and b.kind not in ("text",)]
    return bool(earlier) and earlier[-1].kind == "run"


def _zero_kit_argv(line: str) -> list[str] | None:
    """The zero-kit arguments of a documented command line, also under a launcher (`-m zero_kit.cli ...`); None for
    a line zero-kit printed (`zero-kit train: ...`, a covered sample)."""
    command = re.sub(r"^(\w+=\S*\s+)*", "", line)
    if re.match(r"zero-kit [\w-]+: ", command) or command.split(" ", 1)[0] not in ("zero-kit", *LAUNCHERS):
        return None  # a line zero-kit printed, or no command of zero-kit's (a covered sample, a tree)
    words = shlex.split(line, comments=True)
    while words and re.fullmatch(r"\w+=\S*", words[0]):  # VAR=value before the command
        words = words[1:]
    if not words:
        return None
    if words[0] == "zero-kit":
        return words[1:]
    for flag in ("-m", "--module"):
        if words[0] in LAUNCHERS and flag in words and words[words.index(flag) + 1] == "zero_kit.cli":
            return words[words.index(flag) + 2 :]
    return None


def test_launches_parse():
    """Every zero-kit command of a `parse` or `covered` block is one zero-kit's parser takes: flags and values."""
    from zero_kit.cli import build_parser

    failed = []
    for block in docs.all_blocks():
        if block.kind not in ("parse", "covered", "run") or block.lang == "python":
            continue
        pairs = docs.commands(block.text)
        first = (docs.runs_first(block) or len(pairs)) if block.kind == "run" else 0
        for line, _ in pairs[first:]:
            argv = _zero_kit_argv(line)
            if argv is None:
                continue
            parser = build_parser(argv[0])
            if "--" in argv:
                argv = argv[: argv.index("--")]
            try:
                parser.parse_args(argv)
            except SystemExit:
                failed.append(f"{block.where}: {line}")
    assert not failed, "\n".join(failed)


@pytest.mark.parametrize("path", [str(p) for p in docs.doc_files()])
def test_quick_commands_run_as_written(path, tmp_path, tiny_model):
    folder = _folder(tmp_path, tiny_model)
    last = None
    for block in docs.blocks(Path(path)):
        if block.kind == "file":
            (folder / block.arg).write_text(block.text, encoding="utf-8")
        elif block.kind in ("output", "shape"):
            missing = docs.missing_lines(block.text, last, shape=block.kind == "shape")
            assert not missing, (
                f"{block.where}: not printed by the run block above:\n" + "\n".join(missing) + f"\n--- printed:\n{last}"
            )
        elif block.kind == "run" and block.lang == "python":
            script = folder / f"snippet_{block.line}.py"
            script.write_text(block.text, encoding="utf-8")
            proc = _run(f"python {script.name}", folder, rank_of_one=True)
            last = proc.stdout + proc.stderr
            assert proc.returncode == 0, f"{block.where}: the snippet exited {proc.returncode}:\n{last[-3000:]}"
        elif block.kind == "run":
            for line, shown in docs.commands(block.text)[: docs.runs_first(block)]:
                proc = _run(line, folder)
                last = proc.stdout + proc.stderr
                said = f"{block.where}: `{line}` exited {proc.returncode}:\n{last[-3000:]}"
                if shown:
                    missing = docs.missing_lines(shown, last)
                    assert not missing, f"{said}\nnot printed:\n" + "\n".join(missing)
                else:
                    assert proc.returncode == docs.expected_exit(line), said
                missing = [figure for figure in docs.quoted_figures(line) if figure not in last]
                assert not missing, f"{said}\nthe comment's {missing} not printed"
                assert last.count("FutureWarning") <= FUTURE_WARNINGS, said
