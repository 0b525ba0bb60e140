"""The tier of mistakes, inputs (issue 30, cases 6 and 7 and "check first, then act"): a table of bad inputs over
every command. Each case runs the real `zero-kit` console script in a scratch directory holding the files it
needs, and asserts the exit code, the one error line naming what was wrong with its fix, no traceback, an answer
within FAST_ERROR_S, and that nothing in the directory changed (snapshot before and after). The train cases ask
for two ranks: they must be refused in the parent, before the relaunch (a rank would take half a minute)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.jobs import held_port, pythonpath_with
from tests.support.mistakes import answer, assert_refused, snapshot
from zero_kit.checkpoints import store

BINARY = bytes(range(256)) * 4  # not UTF-8, not JSON: a file given by mistake (an image, a checkpoint shard)
BERT = {"model_type": "bert", "architectures": ["BertModel"], "hidden_size": 768, "num_hidden_layers": 12,
        "num_attention_heads": 12, "intermediate_size": 3072, "vocab_size": 30522}  # fmt: skip
GPT2 = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 768, "n_layer": 12, "n_head": 12}
ALPACA_ROW = {"instruction": "say hi", "input": "", "output": "hi"}


def _files(root: Path) -> None:
    """What a user's directory holds when they make these mistakes: their own files beside zero-kit's."""
    (root / "mine.json").write_text('{"train_micro_batch_size_per_gpu": 1}\n')  # a hand-written config
    (root / "notes.sh").write_text("#!/bin/bash\necho my own script\n")
    (root / "blob.bin").write_bytes(BINARY)
    (root / "results").mkdir()
    (root / "results" / "notes.txt").write_text("not a bench run\n")
    for name, config in (("bert", BERT), ("gpt2", GPT2)):
        (root / name).mkdir()
        (root / name / "config.json").write_text(json.dumps(config))
    (root / "hosts").write_text("node1 slots=2\nnode2 slots=2\nnode1 slots=2\n")
    rows = [json.dumps(ALPACA_ROW)] * 3
    (root / "torn.jsonl").write_text("\n".join([rows[0], '{"instruction": "cut', rows[1]]) + "\n")
    (root / "alpaca.jsonl").write_text("\n".join(rows) + "\n")
    (root / "empty_output.jsonl").write_text(json.dumps({**ALPACA_ROW, "output": ""}) + "\n")
    _foreign_and_own_checkpoints(root / "run")


def _foreign_and_own_checkpoints(output: Path) -> None:
    """Issue 30, cases 1 and 2: an HF Trainer's checkpoint-500 beside two complete ones of zero-kit's."""
    foreign = output / "checkpoint-500"
    foreign.mkdir(parents=True)
    (foreign / "trainer_state.json").write_text('{"global_step": 500}')
    (foreign / "model.safetensors").write_bytes(b"\0" * 64)
    for step in (1, 2):
        own = output / f"checkpoint-{step}"
        own.mkdir()
        (own / "zero_kit_complete.json").write_text(json.dumps({"step": step}))


@dataclass(frozen=True)
class Case:
    args: tuple[str, ...]
    needles: tuple[str, ...]
    code: int = 2
    setup: Callable[[Path], None] | None = field(default=None, compare=False)


TRAIN = ("train", "--nproc", "2", "--max-steps", "2")
CASES = {
    # the command line itself (allow_abbrev=False, did-you-mean)
    "unknown command": Case(("trian",), ("invalid choice: 'trian'", "did you mean 'train'?")),
    "flag prefix": Case((*TRAIN, "--max-step", "3"), ("unrecognized arguments: --max-step", "--max-steps")),
    "mistyped flag": Case(("config", "--stgae", "3"), ("--stgae", "did you mean --stage")),
    "mistyped choice": Case(("train", "--format", "alpacca"), ("--format", "did you mean 'alpaca'?")),
    # config
    "config -o unwritable": Case(("config", "-o", "/proc/x.json"), ("-o /proc/x.json", "fix: choose a writable -o")),
    "config -o foreign file": Case(("config", "-o", "mine.json"), ("-o mine.json", "--force")),
    "config -o a directory": Case(("config", "-o", "results"), ("-o results: is a directory",)),
    "config --model binary": Case(
        ("config", "--model", "blobdir"),
        ("config.json", "fix:"),
        setup=lambda r: (r / "blobdir").mkdir() or (r / "blobdir/config.json").write_bytes(BINARY),
    ),  # fmt: skip
    "config --accelerate-yaml unwritable": Case(
        ("config", "-o", "new.json", "--accelerate-yaml", "/proc/a.yaml"), ("--accelerate-yaml /proc/a.yaml",)
    ),
    # validate
    "validate missing": Case(("validate", "nope.json"), ("nope.json: no such file", "fix:")),
    "validate binary": Case(("validate", "blob.bin"), ("blob.bin", "UTF-8", "fix:")),
    "validate a directory": Case(("validate", "results"), ("results", "directory", "fix:")),
    # plan (case 6 and 7)
    "plan -o unwritable": Case(
        ("plan", "--model", "llama-3-8b", "--gpu-mem", "80GB", "-o", "/proc/x.json"), ("-o /proc/x.json", "fix:")
    ),  # fmt: skip
    "plan -o foreign file": Case(
        ("plan", "--model", "llama-3-8b", "--gpu-mem", "80GB", "-o", "mine.json"),
        ("-o mine.json", "did not write", "--force"),
    ),  # fmt: skip
    "plan --calibrate binary": Case(
        ("plan", "--model", "llama-3-8b", "--gpu-mem", "80GB", "--calibrate", "blob.bin"),
        ("--calibrate blob.bin", "results.jsonl"),
    ),  # fmt: skip
    "plan --gpu-record binary": Case(
        ("plan", "--model", "llama-3-8b", "--gpu-mem", "80GB", "--gpu-record", "blob.bin"), ("--gpu-record blob.bin",)
    ),  # fmt: skip
    "plan BERT": Case(
        ("plan", "--model", "bert", "--gpu-mem", "80GB"),
        ("'bert'", "BertModel", "supported: llama, mistral, qwen2", "--params"),
    ),  # fmt: skip
    "plan GPT-2": Case(("plan", "--model", "gpt2", "--gpu-mem", "80GB"), ("'gpt2'", "supported: llama")),
    "plan missing Hub model": Case(
        ("plan", "--model", "tiny-org/absent", "--gpu-mem", "80GB"),
        ("--model tiny-org/absent", "not in the Hugging Face cache", "HF_HUB_OFFLINE=0", "local model directory"),
    ),
    "plan no --gpu-mem": Case(("plan", "--model", "llama-3-8b"), ("--gpu-mem is required", "80GB")),
    # train: refused in the parent, before the relaunch, with --output's checkpoints untouched
    "train missing data": Case((*TRAIN, "--data", "missing.jsonl"), ("--data missing.jsonl", "no such file")),
    "train missing data, foreign checkpoint": Case(
        (*TRAIN, "--output", "run", "--overwrite-output", "--data", "missing.jsonl"), ("--data missing.jsonl",)
    ),  # fmt: skip
    "train into an output holding another tool's files": Case(
        (*TRAIN, "--output", "run"), ("--output run", "did not write", "--overwrite-output")
    ),
    "train --resume never, missing data": Case(
        (*TRAIN, "--output", "run", "--overwrite-output", "--resume", "never", "--data", "missing.jsonl"),
        ("--data missing.jsonl",),
    ),
    "train torn JSONL": Case((*TRAIN, "--data", "torn.jsonl"), ("torn.jsonl: line 2", "not valid JSON")),
    "train wrong format": Case(
        (*TRAIN, "--data", "alpaca.jsonl", "--format", "chat"), ("alpaca.jsonl", "messages", "--format")
    ),  # fmt: skip
    "train bad first row": Case((*TRAIN, "--data", "empty_output.jsonl"), ("row 1", "'output' is empty", "--skip-bad")),
    "train binary data": Case((*TRAIN, "--data", "blob.bin"), ("--data blob.bin", "unknown file type")),
    "train BERT": Case((*TRAIN, "--model", "bert"), ("--model bert", "'bert'", "supported")),
    "train missing model": Case((*TRAIN, "--model", "nope"), ("--model nope: no such directory",)),
    "train missing Hub model": Case(
        (*TRAIN, "--model", "tiny-org/absent"),
        ("--model tiny-org/absent", "not in the Hugging Face cache", "HF_HUB_OFFLINE=0", "local model directory"),
    ),
    "train unwritable output": Case((*TRAIN, "--output", "/proc/run"), ("--output /proc/run", "writable")),
    "train output is a file": Case((*TRAIN, "--output", "mine.json"), ("--output mine.json", "not a directory")),
    "train host twice": Case((*TRAIN, "--hostfile", "hosts"), ("hosts:3", "'node1' again", "line 1")),
    "train missing resume": Case((*TRAIN, "--resume", "nowhere"), ("--resume nowhere", "--resume auto")),
    "train values no run can use": Case((*TRAIN, "--lora-r", "8", "--lora-dropout", "1.5"), ("--lora-dropout",)),
    "train --lr 0": Case((*TRAIN, "--lr", "0"), ("--lr must be > 0",)),
    "train missing ds-config": Case((*TRAIN, "--ds-config", "nope.json"), ("--ds-config nope.json",)),
    # export: tests/mistakes/test_mistakes_checkpoints.py (they need a real checkpoint)
    # bench
    "bench --out unwritable": Case(("bench", "--out", "/proc/b"), ("--out /proc/b", "fix:")),
    "bench --out foreign dir": Case(("bench", "--out", "results"), ("--out results", "did not write", "--force")),
    "bench --out a file": Case(("bench", "--out", "mine.json"), ("--out mine.json", "not a directory")),
    "bench bad steps": Case(("bench", "--steps", "2", "--warmup", "3"), ("--steps 2", "--warmup 3")),
    "bench --report not results": Case(("bench", "--report", "results"), ("--report results", "fix:")),
    "bench --slurm -o foreign": Case(
        ("bench", "--slurm", "--nodes", "1", "--gpus-per-node", "1", "-o", "notes.sh"), ("-o notes.sh", "--force")
    ),  # fmt: skip
    # launch
    "launch -o unwritable": Case(("launch", "--slurm", "-o", "/proc/x.sh"), ("-o /proc/x.sh", "fix:")),
    "launch -o foreign": Case(("launch", "--slurm", "-o", "notes.sh"), ("-o notes.sh", "--force")),
    "launch host twice": Case(("launch", "--hostfile", "hosts"), ("hosts:3", "'node1' again")),
    "launch binary hostfile": Case(("launch", "--hostfile", "blob.bin"), ("--hostfile blob.bin", "not a text file")),
    "launch --hosts twice": Case(
        ("launch", "--write-hostfile", "new", "--hosts", "a,b,a"), ("--hosts names a more than once",)
    ),
    "launch --write-hostfile foreign": Case(
        ("launch", "--write-hostfile", "notes.sh", "--hosts", "a"), ("--write-hostfile notes.sh", "--force")
    ),  # fmt: skip
}


@pytest.mark.parametrize("name", list(CASES))
def test_mistake_gets_one_line_and_changes_nothing(name, tmp_path):
    case = CASES[name]
    _files(tmp_path)
    if case.setup is not None:
        case.setup(tmp_path)
    before = snapshot(tmp_path)
    found = answer(*case.args, cwd=tmp_path)
    assert_refused(found, *case.needles, code=case.code)
    assert snapshot(tmp_path) == before, f"{name}: the directory changed\n{found.stderr}"


def test_train_refuses_a_master_port_this_host_holds(tmp_path):
    """A port that another job listens on: every rank would load the model and then fail with EADDRINUSE."""
    _files(tmp_path)
    before = snapshot(tmp_path)
    with held_port() as port:
        found = answer(*TRAIN, "--master-port", str(port), cwd=tmp_path)
    assert_refused(found, f"--master-port {port}", "holds it already", "leave it out to take a free one", code=2)
    assert snapshot(tmp_path) == before, found.stderr


# Issue 52: the two ends a run can only meet while it trains, each one cheap run of the embedded model in one process.
RUN = ("train", "--max-length", "64", "--micro-batch", "2", "--stall-timeout", "0", "--output", "run")
RUN_WITHIN_S = 240  # imports, a data cache maybe cold, a few steps on 2 shared cores
DISK_FULL_SITE = '''"""A disk that fills up mid-save: writing into ZK_FULL_AT (DeepSpeed copies its recovery script
there last, on rank 0) raises what a full disk raises."""
import errno
import os
import shutil

_copyfile = shutil.copyfile


def copyfile(src, dst, *args, **kwargs):
    if os.environ.get("ZK_FULL_AT", "-") in str(dst).split(os.sep):
        raise OSError(errno.ENOSPC, "No space left on device", str(dst))
    return _copyfile(src, dst, *args, **kwargs)


shutil.copyfile = copyfile
'''


def test_a_diverged_run_stops_with_one_line_and_exports_nothing(tmp_path):
    """--lr 1e9 logged `loss 0.0000` and `grad_norm: Infinity` from step 2 and exported the wrecked weights with exit
    0; now the first non-finite loss stops every rank: one line naming the step and --lr, exit 65, no final/."""
    found = answer(*RUN, "--max-steps", "3", "--lr", "1e9", cwd=tmp_path, timeout=RUN_WITHIN_S + 60)
    assert_refused(found, "training diverged at step", "--lr 1e+09", "final/ was not exported", "lower --lr",
                   code=65, within_s=RUN_WITHIN_S)  # fmt: skip
    run = tmp_path / "run"
    assert not (run / "final").exists() and not list(run.glob("checkpoint-*")), sorted(run.iterdir())


def test_a_disk_that_fills_up_mid_save_is_one_line_naming_the_intact_checkpoint(tmp_path):
    """ENOSPC in the save of checkpoint-2 was a traceback from every rank; now one line from rank 0 with the free
    space, the checkpoint that is intact and the fix, exit 74."""
    site, work = tmp_path / "site", tmp_path / "work"
    site.mkdir()
    work.mkdir()
    (site / "sitecustomize.py").write_text(DISK_FULL_SITE)
    found = answer(*RUN, "--max-steps", "2", "--save-steps", "1", cwd=work, timeout=RUN_WITHIN_S + 60,
                   PYTHONPATH=pythonpath_with(site), ZK_FULL_AT="checkpoint-2")  # fmt: skip
    assert_refused(found, "--output run: the disk is full", "GiB free) while writing checkpoint-2",
                   "checkpoint-1 is complete and intact", "--resume auto continues from checkpoint-1", code=74,
                   within_s=RUN_WITHIN_S)  # fmt: skip
    run = work / "run"
    assert store.newest_complete(run) == run / "checkpoint-1" and not (run / "final").exists()
