"""zero_kit.data.cache (issue 23): data prepared once, found again by its key, rebuilt when any input changes,
prepared by exactly one of many racing processes (also two "nodes" on one filesystem), never taken half-written
from a preparer killed mid-build; and `zero-kit train --nproc 2` says a broken line deep in --data before any rank.

Every cache here lives in a temporary directory."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from tests.support.jobs import env
from tests.support.mistakes import answer, assert_refused
from zero_kit.data import cache
from zero_kit.data.cache import DataSpec, cache_key, prepared
from zero_kit.data.dataset import default_data_path, load_dataset_rows, tokenize_dataset
from zero_kit.data.pipeline import Split
from zero_kit.model import ASSET_TOKENIZER

WORKER = Path(__file__).with_name("data_cache_worker.py")
ROW = {"instruction": "say hi", "input": "", "output": "hi there"}


def _data(path: Path, rows: int = 40) -> str:
    path.write_text("".join(json.dumps({**ROW, "output": f"hi {i}"}) + "\n" for i in range(rows)), encoding="utf-8")
    return str(path)


def _spec(data: str, tokenizer_dir: str = str(ASSET_TOKENIZER), **changes) -> DataSpec:
    base = {"fmt": "alpaca", "max_length": 64, "pack": False, "skip_bad": False, "tokenizer_dir": tokenizer_dir}
    return DataSpec((data,), **{**base, **changes})


class Counting:
    """Loaders that count their calls: a preparation that loads neither rows nor tokenizer tokenized nothing."""

    def __init__(self, data: str, tokenizer):
        self.calls = {"rows": 0, "tokenizer": 0}
        self.data, self.tok = data, tokenizer

    def rows(self):
        self.calls["rows"] += 1
        return load_dataset_rows([self.data], "alpaca")

    def tokenizer(self):
        self.calls["tokenizer"] += 1
        return self.tok


def test_a_second_preparation_reuses_the_entry_and_tokenizes_nothing(tmp_path, tokenizer, capsys):
    data = _data(tmp_path / "d.jsonl")
    with open(data, "a") as file:  # a bad row, skipped and counted: the counts come back from the entry
        file.write(json.dumps({**ROW, "output": ""}) + "\n")
    loaders = Counting(data, tokenizer)
    first = prepared(_spec(data, skip_bad=True), tmp_path / "cache", loaders.rows, loaders.tokenizer)
    assert first.built and loaders.calls == {"rows": 1, "tokenizer": 1}
    assert f"preparing 41 rows of {data} into {first.path}" in capsys.readouterr().err
    second = prepared(_spec(data, skip_bad=True), tmp_path / "cache", loaders.rows, loaders.tokenizer)
    assert not second.built and second.path == first.path and loaders.calls == {"rows": 1, "tokenizer": 1}
    train, held, stats = second.load()
    rows = load_dataset_rows([data], "alpaca")
    reference, reference_stats = tokenize_dataset(rows, tokenizer, "alpaca", 64, skip_bad=True)
    assert held is None and stats == reference_stats and train[:] == reference[:]
    assert stats.skipped == {"empty": 1} and stats.first_skipped == {"empty": f"{data}: row 41 (line 41)"}
    assert train.cache_files and all(f["filename"].startswith(str(first.path)) for f in train.cache_files)  # mapped
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [first.path.name, f"{first.path.name}.lock"]


def test_an_entry_holds_few_large_record_batches(tmp_path, tokenizer, monkeypatch):
    """Each rank that maps an entry reads every record batch's header, and each read maps ~64 KiB of the file into
    it: an entry is written in ROWS_PER_BATCH-row batches (save_to_disk's 1,000-row batches held 66 MiB of every
    rank's memory at 1M rows)."""
    import pyarrow

    data = _data(tmp_path / "d.jsonl", 2500)
    monkeypatch.setattr(cache, "ROWS_PER_BATCH", 1024)
    loaders = Counting(data, tokenizer)
    entry = prepared(_spec(data), tmp_path / "cache", loaders.rows, loaders.tokenizer)
    with pyarrow.memory_map(str(entry.path / cache.SPLITS["train"])) as mapped:
        batches = [batch.num_rows for batch in pyarrow.ipc.open_stream(mapped)]
    assert batches == [1024, 1024, 452]
    reference, _ = tokenize_dataset(load_dataset_rows([data], "alpaca"), tokenizer, "alpaca", 64, skip_bad=False)
    assert entry.load()[0][:] == reference[:]  # every row, in order


def test_every_input_alone_changes_the_key(tmp_path, monkeypatch):
    data = _data(tmp_path / "d.jsonl")
    tokenizer_dir = tmp_path / "tok"
    shutil.copytree(ASSET_TOKENIZER, tokenizer_dir)
    keys = {"base": cache_key(_spec(data, str(tokenizer_dir)))}
    assert cache_key(_spec(data, str(tokenizer_dir))) == keys["base"]  # the same inputs: the same key
    for name, change in {"format": {"fmt": "text"}, "max length": {"max_length": 65}, "pack": {"pack": True},
                         "skip bad": {"skip_bad": True}, "split": {"split": Split(0.1, 0)},
                         "split seed": {"split": Split(0.1, 1)}}.items():  # fmt: skip
        keys[name] = cache_key(_spec(data, str(tokenizer_dir), **change))
    template = tokenizer_dir / "chat_template.jinja"
    template.write_text(template.read_text() + " ")
    keys["chat template"] = cache_key(_spec(data, str(tokenizer_dir)))
    vocab = json.loads((tokenizer_dir / "tokenizer.json").read_text())
    vocab["added_tokens"][0]["content"] += "x"
    (tokenizer_dir / "tokenizer.json").write_text(json.dumps(vocab))
    keys["tokenizer"] = cache_key(_spec(data, str(tokenizer_dir)))
    Path(data).write_text(Path(data).read_text().replace("hi 3", "hi 4"))
    keys["data bytes"] = cache_key(_spec(data, str(tokenizer_dir)))
    monkeypatch.setattr(cache, "DATA_FORMAT_VERSION", cache.DATA_FORMAT_VERSION + 1)
    keys["version"] = cache_key(_spec(data, str(tokenizer_dir)))
    assert len(set(keys.values())) == len(keys), keys


def test_changed_data_is_prepared_again(tmp_path, tokenizer):
    data = _data(tmp_path / "d.jsonl")
    loaders = Counting(data, tokenizer)
    first = prepared(_spec(data), tmp_path / "cache", loaders.rows, loaders.tokenizer)
    Path(data).write_text(Path(data).read_text().replace("hi 3", "hello 3"))
    second = prepared(_spec(data), tmp_path / "cache", loaders.rows, loaders.tokenizer)
    assert second.built and second.path != first.path and loaders.calls["rows"] == 2
    assert "hello" in tokenizer.decode(second.load()[0][3]["input_ids"])


def _workers(tmp_path: Path, data: str, hosts: list[str]) -> list[dict]:
    """One worker process per host name, all released at once on one empty cache directory."""
    go = tmp_path / "go"
    procs = [
        subprocess.Popen([sys.executable, str(WORKER), str(tmp_path / "cache"), data, str(go)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env(ZK_TEST_HOST=host, LOCAL_RANK="0"))
        for host in hosts
    ]  # fmt: skip
    go.touch()
    outs = [proc.communicate(timeout=120) for proc in procs]
    assert all(proc.returncode == 0 for proc in procs), [err[-2000:] for _, err in outs]
    return [json.loads(out.splitlines()[-1]) for out, _ in outs]


def test_racing_processes_prepare_once_and_load_the_same_data(tmp_path):
    results = _workers(tmp_path, _data(tmp_path / "d.jsonl", 3000), ["node0"] * 3)
    assert sum(result["built"] for result in results) == 1, results
    assert len({result["digest"] for result in results}) == 1


def test_two_nodes_on_one_shared_directory_prepare_once(tmp_path):
    results = _workers(tmp_path, _data(tmp_path / "d.jsonl", 3000), ["node-a", "node-b"])
    assert sum(result["built"] for result in results) == 1 and len({r["digest"] for r in results}) == 1, results
    (entry,) = [p for p in (tmp_path / "cache").iterdir() if p.is_dir()]
    builder = next(result["host"] for result in results if result["built"])
    assert json.loads((entry / cache.META).read_text())["host"] == builder


def test_a_preparer_killed_mid_build_leaves_nothing_that_is_used(tmp_path, tokenizer, capsys):
    data = _data(tmp_path / "d.jsonl", 3000)
    hanging = subprocess.Popen([sys.executable, str(WORKER), str(tmp_path / "cache"), data], stdout=subprocess.PIPE,
                               text=True, env=env(ZK_TEST_HANG="1"))  # fmt: skip
    assert hanging.stdout.readline().strip() == "hanging"
    partial = list((tmp_path / "cache").glob(".tmp-*"))
    assert [p.name for p in partial[0].glob("work/*")], "no partial output to leave behind"
    hanging.kill()  # SIGKILL: no cleanup of its own; the kernel drops its flock
    hanging.wait(timeout=30)
    assert partial[0].is_dir() and not [p for p in (tmp_path / "cache").iterdir() if p.name[0] != "." and p.is_dir()]
    loaders = Counting(data, tokenizer)
    entry = prepared(_spec(data), tmp_path / "cache", loaders.rows, loaders.tokenizer)
    err = capsys.readouterr().err
    assert entry.built and f"removed {partial[0]}, a preparation cut short" in err and "waiting" not in err
    assert not partial[0].exists() and len(entry.load()[0]) == 3000


def test_a_broken_line_deep_in_data_is_said_before_any_rank_starts(tmp_path):
    """Line 5000 lies past the first MiB the input checks read: the launching process finds it while it prepares,
    before any launcher, process group or op build."""
    lines = [json.dumps({**ROW, "output": "x" * 300})] * 5000
    lines[4999] = '{"instruction": "cut'
    (tmp_path / "deep.jsonl").write_text("\n".join(lines) + "\n")
    found = answer("train", "--nproc", "2", "--data", "deep.jsonl", "--output", "out", cwd=tmp_path,
                   HF_DATASETS_CACHE=str(tmp_path / "hf"))  # fmt: skip
    assert_refused(found, "deep.jsonl: line 5000: not valid JSON", code=2)
    assert "launching" not in found.stdout + found.stderr and not (tmp_path / "out").exists()
    assert not list((tmp_path / "hf" / "zero_kit").glob(".tmp-*"))


def test_default_cache_directory_follows_the_hugging_face_variables(tmp_path):
    assert cache.default_cache_dir({"HF_DATASETS_CACHE": "/d"}) == Path("/d/zero_kit")
    assert cache.default_cache_dir({"HF_HOME": "/h"}) == Path("/h/datasets/zero_kit")
    assert cache.default_cache_dir({"XDG_CACHE_HOME": "/x"}) == Path("/x/huggingface/datasets/zero_kit")
    assert default_data_path("alpaca").endswith("alpaca.jsonl")


def test_parallel_preparation_equals_the_in_memory_one(tmp_path, tokenizer, monkeypatch):
    """Dataset.map in two processes (the cache's path for big data), with a bad row skipped, a split and packing,
    gives exactly what tokenize_split gives in this process."""
    from zero_kit.data import pipeline
    from zero_kit.data.dataset import tokenize_split

    monkeypatch.setattr(pipeline, "ROWS_PER_PROCESS", 200)
    monkeypatch.setattr(pipeline.os, "sched_getaffinity", lambda _pid: {0, 1})  # two processes on any machine
    data = _data(tmp_path / "d.jsonl", 600)
    with open(data, "a") as file:
        file.write(json.dumps({**ROW, "output": ""}) + "\n")
    rows = load_dataset_rows([data], "alpaca")
    assert pipeline.num_proc(len(rows)) == 2
    split = Split(0.1, 3)
    train, held, stats = pipeline.build_parts(rows, tokenizer, "alpaca", 64, skip_bad=True, pack=True, split=split,
                                              workdir=tmp_path / "work")  # fmt: skip
    reference = tokenize_split(rows, tokenizer, "alpaca", 64, val_size=0.1, seed=3, skip_bad=True, pack=True)
    assert (train[:], held[:], stats) == (reference[0][:], reference[1][:], reference[2])
    assert stats.skipped == {"empty": 1} and len(held) > 0
