"""The quick commands print nothing of DeepSpeed's start-up noise and raise no deprecation from zero_kit's code:
`zero-kit validate` on a CPU host used to print DeepSpeed's "Setting accelerator to CPU" line on every run."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
from pathlib import Path

from zero_kit.cli import quiet_cpu_accelerator_notice

ROOT = Path(__file__).resolve().parents[2]
NOTICE = "Setting accelerator to CPU"
# Every deprecation shown, so one raised in zero_kit's own files (path .../zero_kit/...) cannot hide behind the
# default filters; the libraries' warnings about their own internals are theirs.
SHOW_ALL = ["-W", "always::FutureWarning", "-W", "always::DeprecationWarning"]
OWN_WARNING = re.compile(r"/zero_kit/[\w/]+\.py:\d+: \w*Warning")


def _zero_kit(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, *SHOW_ALL, "-m", "zero_kit.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_validate_prints_no_cpu_accelerator_notice_and_no_warning_of_ours():
    proc = _zero_kit("validate", "ds_configs/zero3.json", "ds_configs/hf_zero2.json", "--for", "hf-trainer")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert NOTICE not in proc.stdout + proc.stderr
    assert not OWN_WARNING.search(proc.stderr), proc.stderr


def test_config_raises_no_warning_of_ours(tmp_path):
    proc = _zero_kit("config", "--stage", "3", "-o", str(tmp_path / "ds.json"))
    assert proc.returncode == 0 and not OWN_WARNING.search(proc.stderr), proc.stderr


def test_the_filter_drops_only_that_record():
    logger = logging.getLogger("DeepSpeed")
    quiet_cpu_accelerator_notice()
    quiet_cpu_accelerator_notice()
    assert sum(getattr(f, "__name__", "") == "_drops_cpu_accelerator_notice" for f in logger.filters) == 1

    def record(msg: str) -> logging.LogRecord:
        return logger.makeRecord("DeepSpeed", logging.WARNING, "real_accelerator.py", 1, msg, (), None)

    assert not logger.filter(record(NOTICE + ". If you have GPU or other accelerator, we were unable to detect it."))
    assert logger.filter(record("Setting ds_accelerator to cuda (auto detect)"))
    assert logger.filter(record("some other DeepSpeed warning"))


def test_a_row_longer_than_the_tokenizers_own_maximum_gets_no_tokenizer_warning():
    """The shipped tokenizer says model_max_length 512; a --max-length 4096 run's rows are longer, and transformers
    warned "Token indices sequence length is longer than the specified maximum" for each data preparation. zero-kit
    judges the length itself (a row over --max-length is an error naming it, or counted with --skip-bad)."""
    code = (
        "from zero_kit.model import load_tokenizer\n"
        "from zero_kit.data.formats import tokenize_texts\n"
        "from zero_kit.data.preference import tokenize_pairs\n"
        "tokenizer = load_tokenizer(None)\n"
        "assert len(tokenize_texts(tokenizer, ['word ' * 3000], with_offsets=True)[0].ids) > 512\n"
        "tokenize_pairs([{'prompt': 'word ' * 3000, 'chosen': 'a', 'rejected': 'b'}], [False], tokenizer)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0 and "longer than the specified maximum" not in proc.stderr, proc.stderr
