"""Issue 52, "nothing lost": a bad value or input is refused before any work (exit 2, one line naming the flag or
file and the fix, nothing created), in the process the user started. Each case ran into work on the code before
issue 52: a port out of range (OverflowError after bench made logs/; launch wrote its script), `--output ""`
(trained into the current directory), a --ds-config syntax error (said alone, after the other inputs were fixed),
LoRA targets that match nothing and a model directory without weights (found by every rank), `--data DIR` of
JSONL files (refused, though --help offers it), --skip-bad on a line that is not JSON (refused), and the free-space
check (one checkpoint where --save-total-limit keeps more). Run in-process through zero_kit.cli.main; the
diverged run and the full disk, which need training, are in tests/mistakes/test_mistakes_inputs.py."""

from __future__ import annotations

import errno
import json
import os
import shutil
from collections import namedtuple
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.support.mistakes import snapshot
from zero_kit.cli import main
from zero_kit.errors import UserError
from zero_kit.train.guards import preflight
from zero_kit.train.guards.inputs import check_inputs
from zero_kit.train.options import TrainOptions, check_options

ROW = {"instruction": "say hi", "input": "", "output": "hi"}
SMALL_LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 32, "num_hidden_layers": 1,
               "intermediate_size": 64, "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 1823,
               "max_position_embeddings": 512}  # fmt: skip
LAYER = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
         "mlp.up_proj", "mlp.down_proj", "input_layernorm", "post_attention_layernorm")  # fmt: skip
Usage = namedtuple("Usage", "total used free")


@pytest.fixture
def here(tmp_path, monkeypatch):
    """A user's directory with a data file: zero-kit runs there, offline, its data cache inside (a tokenizing
    would show in the snapshot)."""
    from zero_kit.launch.ops import ENV, extensions_dir

    monkeypatch.setenv(ENV, os.environ.get(ENV) or str(extensions_dir()))  # what `train` sets, put back after
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data.jsonl").write_text(json.dumps(ROW) + "\n")
    return tmp_path


def refused(argv: list[str], capsys) -> str:
    """`zero-kit ARGV` in this process: exit 2 and one error line (its fix below it), no traceback; its stderr."""
    try:
        code = main(argv)
    except SystemExit as done:  # argparse's usage errors
        code = done.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and sum(": error: " in line for line in err.splitlines()) == 1, err
    return err


# case 1: ports


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "--master-port", "99999"],
        ["train", "--master-port", "-5"],
        ["bench", "--master-port", "99999"],
        ["launch", "--slurm", "--master-port", "70000", "-o", "job.sbatch"],
    ],
)
def test_a_port_out_of_range_is_refused_where_the_flag_is_parsed(argv, here, capsys):
    before = snapshot(here)
    port = argv[argv.index("--master-port") + 1]
    err = refused(argv, capsys)
    assert f"argument --master-port: {port} is out of range: a TCP port is 1..65535" in err
    assert snapshot(here) == before  # no bench_out/logs/, no sbatch script


def test_the_bench_refuses_a_first_port_whose_last_run_is_out_of_range(here, capsys):
    before = snapshot(here)
    err = refused(["bench", "--master-port", "65534"], capsys)  # 5 strategies: 65534..65538
    assert "run 5 of this bench would meet on port 65538" in err and "--master-port 65531 or lower" in err
    assert snapshot(here) == before


def test_a_run_file_and_the_python_api_refuse_a_port_out_of_range(here, capsys):
    (here / "run.yaml").write_text("max_steps: 1\nmaster_port: 99999\n")
    err = refused(["train", "--config", "run.yaml"], capsys)
    assert "run.yaml:2: master_port: 99999 is not a valid value for --master-port" in err and "1..65535" in err
    with pytest.raises(UserError, match="--master-port 70000: a TCP port is 1..65535"):
        check_options(TrainOptions(master_port=70000))


# case 2: empty paths


@pytest.mark.parametrize("flag", ["--output", "--data", "--ds-config", "--hostfile", "--data-cache", "--model"])
def test_an_empty_path_is_refused_not_taken_for_the_current_directory(flag, here, capsys):
    before = snapshot(here)
    err = refused(["train", flag, ""], capsys)
    assert f"{flag} is empty" in err and f"leave {flag} out" in err
    assert snapshot(here) == before


# case 4: a --ds-config syntax error


def test_a_ds_config_syntax_error_is_said_with_the_other_inputs_before_any_tokenizing(here, capsys):
    (here / "bad.json").write_text('{"train_micro_batch_size_per_gpu": 1,\n')
    before = snapshot(here)
    err = refused(["train", "--nproc", "2", "--data", "missing.jsonl", "--ds-config", "bad.json"], capsys)
    assert "2 problems" in err and "--data missing.jsonl" in err
    assert "--ds-config bad.json:2:1: not valid JSON" in err and "zero-kit validate bad.json" in err
    err = refused(["train", "--nproc", "2", "--data", "data.jsonl", "--ds-config", "bad.json"], capsys)
    assert "--ds-config bad.json:2:1: not valid JSON" in err
    assert snapshot(here) == before  # no hf/zero_kit/ entry: nothing was tokenized


# case 5: the model's files and --lora-targets


def _model_dir(root: Path, names: list[str] | None = None) -> Path:
    """A small LLaMA directory: config.json and (names) a model.safetensors holding those tensors."""
    import numpy
    from safetensors.numpy import save_file

    root.mkdir()
    (root / "config.json").write_text(json.dumps(SMALL_LLAMA))
    if names is not None:
        save_file({name: numpy.zeros(2, dtype=numpy.float32) for name in names}, str(root / "model.safetensors"))
    return root


def _llama_names() -> list[str]:
    layer = [f"model.layers.0.{name}.weight" for name in LAYER]
    return ["model.embed_tokens.weight", *layer, "model.norm.weight", "lm_head.weight"]


def test_a_lora_target_that_matches_nothing_is_refused_with_the_models_names(here, capsys):
    model = _model_dir(here / "small", _llama_names())
    before = snapshot(here)
    err = refused(["train", "--nproc", "2", "--lora-r", "8", "--lora-targets", "q_proj,qkv_projj"], capsys)
    assert "--lora-targets q_proj,qkv_projj: no module of the model is named qkv_projj" in err
    assert "q_proj, k_proj, v_proj, o_proj, gate_proj" in err and "did you mean" in err
    check_inputs(TrainOptions(model=str(model), lora_r=8, lora_targets="self_attn.v_proj,down_proj"))
    with pytest.raises(UserError, match="no module of the model is named up_projj") as caught:
        check_inputs(TrainOptions(model=str(model), lora_r=8, lora_targets="up_projj"))
    assert "did you mean up_proj (not up_projj)?" in caught.value.fix
    assert snapshot(here) == before


def test_a_model_directory_without_weights_or_with_a_missing_shard_is_refused_naming_the_file(here, capsys):
    _model_dir(here / "bare")
    sharded = _model_dir(here / "sharded", None)
    (sharded / "model-00001-of-00002.safetensors").write_bytes(b"")
    index = {"weight_map": {"lm_head.weight": "model-00002-of-00002.safetensors",
                            "model.norm.weight": "model-00001-of-00002.safetensors"}}  # fmt: skip
    (sharded / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(UserError, match="lists 1 shard.s. that are not there: model-00002-of-00002.safetensors"):
        check_inputs(TrainOptions(model=str(sharded)))
    cut = _model_dir(here / "cut", _llama_names())
    data = (cut / "model.safetensors").read_bytes()
    (cut / "model.safetensors").write_bytes(data[:-4])  # a download cut short
    before = snapshot(here)
    err = refused(["train", "--nproc", "2", "--model", "bare"], capsys)
    assert "--model bare: no weights in it (none of model.safetensors" in err
    with pytest.raises(UserError, match="model.safetensors: cut short"):
        check_inputs(TrainOptions(model=str(cut)))
    assert snapshot(here) == before


def test_the_embedded_models_pinned_names_are_what_transformers_builds():
    import torch
    from transformers import AutoModelForCausalLM

    from zero_kit.model import TINY_VOCAB, tiny_llama_config
    from zero_kit.train.guards.model_files import embedded_module_names

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(tiny_llama_config(vocab_size=TINY_VOCAB))
    owners = list(dict.fromkeys(name.rpartition(".")[0] for name, _ in model.named_parameters()))
    assert sorted(embedded_module_names()) == sorted(owners)


def test_a_hub_snapshot_without_weights_is_refused_once_resolved(here, monkeypatch, capsys):
    from huggingface_hub import constants

    from tests.support.hub_cache import cache_model_dir

    source = _model_dir(here / "source")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(here / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    cache_model_dir(source, here / "hub", "tiny-org/bare")
    err = refused(["train", "--model", "tiny-org/bare", "--output", "run"], capsys)
    assert "no weights in it" in err and "snapshots" in err
    assert not (here / "run").exists() and not (here / "hf").exists()


# case 6: --data DIR


def test_data_directory_of_jsonl_files_is_one_dataset_in_name_order(here):
    from zero_kit.data.dataset import load_dataset_rows

    folder = here / "rows"
    folder.mkdir()
    (folder / "b.jsonl").write_text(json.dumps({**ROW, "output": "second"}) + "\n")
    (folder / "a.jsonl").write_text(json.dumps({**ROW, "output": "first"}) + "\n")
    (folder / "notes.md").write_text("not data\n")
    check_inputs(TrainOptions(data=str(folder), output=str(here / "out")))  # refused before issue 52
    rows = load_dataset_rows([str(folder)], "alpaca")
    assert [row["output"] for _, _, row in rows] == ["first", "second"]
    assert [Path(source.path).name for source in rows.sources] == ["a.jsonl", "b.jsonl"]
    (here / "empty").mkdir()
    with pytest.raises(UserError, match="--data .*empty: no data files in it"):
        check_inputs(TrainOptions(data=str(here / "empty"), output=str(here / "out")))


# case 7: --skip-bad and lines that are not JSON


def test_skip_bad_skips_and_counts_lines_that_are_not_json(here, tokenizer):
    from zero_kit.data.cache import DataSpec, prepared
    from zero_kit.data.dataset import load_dataset_rows, tokenize_dataset
    from zero_kit.model import ASSET_TOKENIZER

    torn = here / "torn.jsonl"
    torn.write_bytes(
        b"\n".join([json.dumps(ROW).encode(), b'{"instruction": "cut', b"caf\xe9", json.dumps(ROW).encode()])
    )
    with pytest.raises(UserError, match="torn.jsonl: line 2: not valid JSON") as err:
        check_inputs(TrainOptions(data=str(torn), output=str(here / "out")))
    assert "--skip-bad" in err.value.fix
    check_inputs(TrainOptions(data=str(torn), skip_bad=True, output=str(here / "out")))
    _, stats = tokenize_dataset(load_dataset_rows([str(torn)], "alpaca"), tokenizer, "alpaca", 64, skip_bad=True)
    assert (stats.rows_read, stats.rows_kept, dict(stats.skipped)) == (4, 2, {"not_json": 2})
    assert stats.first_skipped["not_json"].endswith("torn.jsonl: row 2 (line 2)")
    # the run's own path: prepared into the data cache from the rows as `zero-kit train` loads them
    spec = DataSpec((str(torn),), "alpaca", 64, False, True, str(ASSET_TOKENIZER))
    entry = prepared(spec, here / "cache", lambda: load_dataset_rows([str(torn)], "alpaca"), lambda: tokenizer)
    assert dict(entry.load()[2].skipped) == {"not_json": 2}
    with pytest.raises(UserError, match="torn.jsonl: line 2: not valid JSON"):  # not skipped: the first one said
        tokenize_dataset(load_dataset_rows([str(torn)], "alpaca"), tokenizer, "alpaca", 64)
    assert "line 3: not valid UTF-8" in str(load_dataset_rows([str(torn)], "alpaca").sources[0].rows[2].error("t"))


def test_a_json_document_error_says_skip_bad_cannot_skip_it(here):
    from zero_kit.data.dataset import load_dataset_rows

    (here / "rows.json").write_text('[{"instruction": "a", "output": "b"},\n {"instruction": ]\n')
    with pytest.raises(UserError, match="rows.json: line 2: not valid JSON") as err:
        load_dataset_rows([str(here / "rows.json")], "alpaca")
    assert "--skip-bad" in err.value.fix and "cannot skip" in err.value.fix


# case 8: free space for what --save-total-limit keeps


@pytest.mark.parametrize(
    ("keep", "saves", "existing", "at_once"),
    [(2, 1, 0, 1), (2, 2, 0, 2), (2, 5, 0, 3), (2, None, 0, 3), (None, 5, 0, 5), (None, None, 3, 1), (2, 5, 1, 2),
     (2, 2, 1, 2), (2, 5, 5, 1), (1, 5, 0, 2)],
)  # fmt: skip
def test_checkpoints_at_once(keep, saves, existing, at_once):
    assert preflight.checkpoints_at_once(keep, saves, existing) == at_once


def test_the_free_space_check_counts_what_save_total_limit_keeps_before_any_tokenizing(here, monkeypatch, capsys):
    from zero_kit.train import rundata
    from zero_kit.train.plan import model_shape

    one, _ = preflight.checkpoint_bytes(model_shape(TrainOptions()).n_params, "fp32")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**12, 10**12, int(2.5 * one)))
    monkeypatch.setattr(rundata, "prepare", lambda *a: pytest.fail("the data was prepared"))  # before issue 52
    before = snapshot(here)
    err = refused(["train", "--nproc", "2", "--save-steps", "1", "--max-steps", "4", "--output", "run"], capsys)
    assert "--output run: " in err and "3 more checkpoints at once need about" in err and "--save-total-limit" in err
    assert snapshot(here) == before
    err = refused(["train", "--nproc", "2", "--save-steps", "1", "--max-steps", "4", "--save-total-limit", "1",
                   "--output", "run", "--data", "missing.jsonl"], capsys)  # fmt: skip
    assert "--data missing.jsonl" in err  # 2 at once fit: the next problem is said


# case 9: a disk that fills up while the run writes


def _checkpoint(output: Path, step: int, complete: bool) -> Path:
    from zero_kit.checkpoints import store

    path = output / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / "weights.bin").write_bytes(b"x" * 8)
    if complete:
        store.write_manifest(path, step=step, world_size=1)
    else:
        store.mark_partial(path)
    return path


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EROFS])
def test_a_disk_error_mid_run_is_one_line_naming_the_intact_checkpoint(tmp_path, code):
    _checkpoint(tmp_path, 1, complete=True)
    _checkpoint(tmp_path, 2, complete=False)
    err = OSError(code, os.strerror(code), str(tmp_path / "checkpoint-2" / "x.pt"))
    error, _ = preflight.disk_full_error(err, tmp_path, 10**15, 2)
    assert error.exit_code == preflight.EXIT_DISK_FULL == 74
    assert "while writing checkpoint-2; checkpoint-1 is complete and intact" in error.message
    assert f"--output {tmp_path}: " in error.message and "GiB free" in error.message
    assert "--resume auto continues from checkpoint-1" in error.fix


def test_a_peers_failure_in_a_save_on_a_full_disk_is_the_same_end(tmp_path, monkeypatch):
    """A rank whose peer left in the save sees a failed collective (a RuntimeError): with checkpoint-N incomplete and
    the disk unable to hold one, it is the disk (every rank can tell; rank 0 says it)."""
    _checkpoint(tmp_path, 2, complete=False)
    peer_gone = RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:7053")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**9, 10**9, 10**5))
    error, plain = preflight.disk_full_error(peer_gone, tmp_path, 10**8, 2)
    assert plain and "the disk is full (0.00 GiB free) while writing checkpoint-2" in error.message
    assert "no checkpoint is complete yet" in error.message and "it starts over" in error.fix
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**12, 0, 10**12))
    assert preflight.disk_full_error(peer_gone, tmp_path, 10**8, 2) is None  # room on the disk: another failure
    assert preflight.disk_full_error(FileNotFoundError(errno.ENOENT, "gone"), tmp_path, 10**8, 2) is None


def test_safetensors_own_disk_full_error_is_recognised(tmp_path):
    wrapped = RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)")
    error, _ = preflight.disk_full_error(wrapped, tmp_path, 1, 3)
    assert "the disk is full" in error.message and "while writing to it" in error.message


# case 3: a diverged run (the run itself: tests/mistakes/test_mistakes_inputs.py)


def test_divergence_is_a_non_finite_loss_or_gradient_norm_but_fp16_overflows_are_not():
    from zero_kit.train.guards.diverged import non_finite

    assert non_finite({"loss": 2.5, "grad_norm": 1.0}, loss_scaled=False) is None
    assert non_finite({"loss": float("nan"), "grad_norm": 1.0}, loss_scaled=False) == "the loss is nan"
    assert non_finite({"loss": 2.5, "grad_norm": float("inf")}, loss_scaled=False) == "the gradient norm is inf"
    assert non_finite({"loss": 2.5, "grad_norm": float("inf")}, loss_scaled=True) is None  # a skipped fp16 step
    assert non_finite({"eval_loss": float("nan")}, loss_scaled=False) is None


@pytest.mark.parametrize("keep", [False, True])
def test_every_rank_stops_at_the_logged_step_without_saving_it_unless_asked(tmp_path, keep):
    from zero_kit.train.guards.diverged import DivergenceCallback

    callback = DivergenceCallback(loss_scaled=False, keep=keep)
    control = SimpleNamespace(should_training_stop=False, should_save=True, should_evaluate=True)
    state, args = SimpleNamespace(global_step=7), SimpleNamespace(output_dir=str(tmp_path))
    callback.on_log(args, SimpleNamespace(global_step=6), control, logs={"loss": 3.0, "grad_norm": 2.0})
    assert callback.found is None and not control.should_training_stop
    callback.on_log(args, state, control, logs={"loss": float("nan"), "grad_norm": 2.0, "learning_rate": 5.0})
    assert (callback.found.step, callback.found.learning_rate) == (7, 5.0)
    assert control.should_training_stop and not control.should_evaluate and control.should_save == keep


def test_the_diverged_line_names_the_step_the_lr_and_what_is_left(tmp_path):
    from zero_kit.train.guards.diverged import EXIT_DIVERGED, Divergence, diverged_error

    _checkpoint(tmp_path, 4, complete=True)
    found = Divergence(6, "the loss is nan", 7.5e8)
    error = diverged_error(found, 1e9, 1e-3, tmp_path, given=True, exported=False)
    assert error.exit_code == EXIT_DIVERGED == 65
    assert "training diverged at step 6: the loss is nan, learning rate 7.5e+08 at that step" in error.message
    assert "(--lr 1e+09, 1e+12x the default 0.001)" in error.message and "final/ was not exported" in error.message
    assert "lower --lr (e.g. 0.001)" in error.fix and "--resume auto continues from checkpoint-4" in error.fix
