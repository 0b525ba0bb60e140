"""`zero-kit train --method dpo` without a launch (issue 49): preference rows checked and tokenized as TRL tokenizes
them (against TRL's own preparation), bad rows said with file and row or counted, the bundled set, the flags, and TRL
as an optional dependency refused with its install line. The launches are tests/dist/test_dpo_train.py."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from zero_kit.data.files import Rows, RowSource
from zero_kit.data.formats import BadRow
from zero_kit.data.preference import ASSET_PAIRS, ID_COLUMNS, build_pairs, check_pair, load_pair_rows
from zero_kit.errors import UserError
from zero_kit.train import preference
from zero_kit.train.options import TrainOptions, check_options

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "### Instruction:\nName the ZeRO stage that shards parameters.\n\n### Response:\n"
PLAIN = {"prompt": PROMPT, "chosen": "Stage 3.", "rejected": "Stage 1."}
CHAT = {
    "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What does ZeRO-3 shard?"}],
    "chosen": [{"role": "assistant", "content": "Parameters, gradients and optimizer states."}],
    "rejected": [{"role": "assistant", "content": "Nothing."}],
}


@pytest.fixture(scope="module")
def tokenizer():
    from zero_kit.model import load_tokenizer

    return load_tokenizer(None)


def _rows(rows: list, path: str = "pairs.jsonl") -> Rows:
    return Rows([RowSource(path, "jsonl", rows, ["prompt", "chosen", "rejected"], lines=list(range(1, len(rows) + 1)))])


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ({"prompt": PROMPT, "chosen": "Stage 3."}, "missing_field"),
        ({**PLAIN, "chosen": 3}, "wrong_type"),
        ({**PLAIN, "rejected": CHAT["rejected"]}, "wrong_type"),  # plain and conversational in one row
        ({**CHAT, "chosen": "Stage 3."}, "wrong_type"),
        ({**CHAT, "chosen": [{"role": "robot", "content": "x"}]}, "wrong_type"),
        ({**PLAIN, "rejected": "  "}, "empty"),
        ({**PLAIN, "rejected": PLAIN["chosen"]}, "same"),
        ({**CHAT, "rejected": CHAT["chosen"]}, "same"),
        (["not", "an", "object"], "wrong_type"),
    ],
)
def test_a_bad_pair_is_named_by_its_reason(row, reason):
    with pytest.raises(BadRow) as bad:
        check_pair(row)
    assert bad.value.reason == reason


def test_plain_and_conversational_pairs_pass():
    assert check_pair(PLAIN) is False and check_pair(CHAT) is True


def _trl_prepared(rows: list[dict], tokenizer) -> list[dict]:
    """TRL's own preparation of the rows (DPOTrainer._prepare_dataset, called on a stand-in trainer): the ids its
    training would see."""
    from datasets import Dataset
    from trl import DPOTrainer

    stand_in = SimpleNamespace(_tokenizer=tokenizer, _is_vlm=False)
    args = SimpleNamespace(dataset_num_proc=None, max_length=None, truncation_mode="keep_start")
    prepared = DPOTrainer._prepare_dataset(stand_in, Dataset.from_list(rows), tokenizer, args, "train")
    return [{name: row[name] for name in ("prompt_ids", "chosen_ids", "rejected_ids")} for row in prepared]


@pytest.mark.parametrize("kind", ["plain", "conversational"])
def test_pairs_are_tokenized_as_trl_tokenizes_them(kind, tokenizer):
    rows = [PLAIN, {**PLAIN, "chosen": "Stage 3 shards them.</s>"}] if kind == "plain" else [CHAT]
    train, held, stats = build_pairs(_rows(rows), tokenizer, "preference", 256, skip_bad=False, pack=False)
    assert held is None and train.column_names == list(ID_COLUMNS)
    ours = [{name: train[i][name] for name in ID_COLUMNS} for i in range(len(rows))]
    assert ours == _trl_prepared(rows, tokenizer)
    assert stats.rows_kept == len(rows) and stats.sequences == 2 * len(rows)


def test_a_pair_too_long_is_one_error_naming_file_and_row(tokenizer):
    long = {**PLAIN, "rejected": "Stage one, " * 40}
    with pytest.raises(UserError) as err:
        build_pairs(_rows([PLAIN, long]), tokenizer, "preference", 64, skip_bad=False, pack=False)
    assert err.value.exit_code == 2
    assert "pairs.jsonl: row 2 (line 2)" in err.value.message and "longer than the max length 64" in err.value.message
    assert "raise --max-length (now 64)" in err.value.fix and "--skip-bad" in err.value.fix


def test_skip_bad_counts_each_reason_and_keeps_the_rest(tokenizer):
    rows = [PLAIN, {**PLAIN, "rejected": PLAIN["chosen"]}, {"prompt": PROMPT}, {**PLAIN, "chosen": "x " * 80}, PLAIN]
    train, _, stats = build_pairs(_rows(rows), tokenizer, "preference", 64, skip_bad=True, pack=False)
    assert len(train) == 2 and stats.rows_read == 5
    assert dict(stats.skipped) == {"same": 1, "missing_field": 1, "too_long": 1}
    assert stats.first_skipped["same"] == "pairs.jsonl: row 2 (line 2)"


def test_a_held_out_share_of_pairs_for_evaluation(tokenizer):
    from zero_kit.data.pipeline import Split

    rows = [{**PLAIN, "chosen": f"Stage 3, answer {i}."} for i in range(10)]
    train, held, _ = build_pairs(_rows(rows), tokenizer, "preference", 64, skip_bad=False, pack=False,
                                 split=Split(0.2, 0))  # fmt: skip
    assert (len(train), len(held)) == (8, 2)


def test_pairs_are_never_packed(tokenizer):
    with pytest.raises(UserError, match="--pack"):
        build_pairs(_rows([PLAIN]), tokenizer, "preference", 64, skip_bad=False, pack=True)


def test_the_bundled_set_is_whole_and_fits_64_tokens(tokenizer):
    rows = load_pair_rows(None)
    assert Path(rows.sources[0].path) == ASSET_PAIRS and len(rows) >= 100
    train, _, stats = build_pairs(rows, tokenizer, "preference", 64, skip_bad=False, pack=False)
    assert len(train) == len(rows) and not stats.skipped
    readme = (ASSET_PAIRS.parent / "README.md").read_text(encoding="utf-8")
    assert "Licence" in readme and "make_preference_data" in readme


def test_a_file_without_the_pair_columns_is_refused(tmp_path):
    path = tmp_path / "sft.jsonl"
    path.write_text(json.dumps({"instruction": "a", "output": "b"}) + "\n")
    with pytest.raises(UserError, match=r"missing column\(s\) \['prompt', 'chosen', 'rejected'\]"):
        load_pair_rows([str(path)])


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        ({"beta": 0.5}, "--beta given without --method dpo"),
        ({"dpo_loss": "ipo"}, "--dpo-loss given without --method dpo"),
        ({"method": "dpo", "beta": 0.0}, "--beta must be > 0, got 0"),
        ({"method": "dpo", "pack": True}, "--pack with --method dpo"),
        ({"dpo_reference": "precompute"}, "--dpo-reference given without --method dpo"),
    ],
)
def test_dpo_flags_are_checked_with_the_others(flags, said):
    with pytest.raises(UserError, match=said):
        check_options(TrainOptions(**flags))


def test_dpo_arguments_pass_through_to_trl():
    from trl import DPOConfig

    opts = TrainOptions(method="dpo", beta=0.3, dpo_loss="ipo", max_length=96)
    assert preference.arguments_class(opts) is DPOConfig
    assert preference.method_arguments(opts) == {"beta": 0.3, "loss_type": ["ipo"], "max_length": 96,
                                                 "precompute_ref_log_probs": False}  # fmt: skip
    assert preference.method_arguments(TrainOptions()) == {}
    assert {preference.DEFAULT_LOSS, "ipo", "hinge"} <= set(preference.trl_losses())


def test_without_trl_the_run_is_refused_with_the_extra_to_install(monkeypatch, tmp_path, capsys):
    from zero_kit.cli import main

    monkeypatch.setattr(preference, "trl_version", lambda: None)
    assert main(["train", "--method", "dpo", "--output", str(tmp_path / "out")]) == 2
    said = capsys.readouterr().err
    assert "--method dpo needs TRL, which is not installed" in said and "pip install 'zero_kit[dpo]'" in said
    assert not (tmp_path / "out").exists()


def test_a_trl_outside_the_tested_range_or_loss_it_lacks_is_refused(monkeypatch):
    monkeypatch.setattr(preference, "trl_version", lambda: "0.20.0")
    with pytest.raises(UserError, match="TRL 0.20.0 is installed"):
        preference.check_trl(TrainOptions(method="dpo"))
    monkeypatch.setattr(preference, "trl_version", lambda: "1.0.0")
    monkeypatch.setattr(preference, "trl_losses", lambda: ["sigmoid", "ipo"])
    with pytest.raises(UserError, match="--dpo-loss hinge: TRL 1.0.0 does not know it"):
        preference.check_trl(TrainOptions(method="dpo", dpo_loss="hinge"))
    preference.check_trl(TrainOptions())  # sft needs no TRL
    # the default loss is in every TRL of the range (below): its check imports no TRL (seconds in the start-up)
    monkeypatch.setattr(preference, "trl_losses", lambda: pytest.fail("TRL's DPOConfig imported for the default"))
    preference.check_trl(TrainOptions(method="dpo"))


def test_trls_weight_hash_gives_way_to_zero_kits_key():
    """TRL's DPOTrainer.__init__ hashes every weight for its precompute cache key through its module's name
    `hash_module` (pinned here against the installed TRL: from 1.9, the TRL zero-kit precomputes with); while
    zero-kit's trainer is built that name returns zero-kit's key without reading a weight, and is restored after,
    also when the build fails."""
    import inspect

    from trl import DPOTrainer
    from trl.trainer import dpo_trainer

    if not preference.precompute_supported(preference.trl_version()):
        with preference._keyed_by("key"):  # an older TRL: nothing to stand in for
            return
    assert "hash_module(self.ref_model or self.model)" in inspect.getsource(DPOTrainer.__init__)
    original, read = dpo_trainer.hash_module, []
    module = SimpleNamespace(state_dict=lambda: read.append(1) or {})
    with pytest.raises(RuntimeError), preference._keyed_by("zero-kit key"):
        assert dpo_trainer.hash_module(module) == "zero-kit key" and read == []
        raise RuntimeError("the trainer's build failed")
    assert dpo_trainer.hash_module is original


def test_precompute_needs_the_trl_that_runs_it_under_deepspeed(monkeypatch):
    """TRL before 1.9.0 (huggingface/trl#6403) ran its precompute on parameters DeepSpeed had not placed yet."""
    monkeypatch.setattr(preference, "trl_version", lambda: "1.8.0")
    with pytest.raises(UserError, match=r"--dpo-reference precompute: TRL 1.8.0 cannot precompute") as raised:
        preference.check_trl(TrainOptions(method="dpo", dpo_reference="precompute"))
    assert "--dpo-reference model" in raised.value.fix
    preference.check_trl(TrainOptions(method="dpo"))  # auto falls back to the model instead
    assert not preference.choose_reference(TrainOptions(method="dpo"), 16, 4).precompute


@pytest.mark.parametrize(
    ("flags", "precompute", "said"),
    [
        ({}, True, "the run reads every pair (1 times)"),  # one epoch
        ({"max_steps": 4}, True, "the run reads every pair (1.0 times)"),  # 4 steps x 4 pairs = the 16 pairs
        ({"max_steps": 3}, False, "the run reads 12 of 16 pairs"),
        ({"max_steps": 3, "dpo_reference": "precompute"}, True, "--dpo-reference precompute"),
        ({"dpo_reference": "model"}, False, "--dpo-reference model"),
    ],
)
def test_auto_precomputes_when_the_run_reads_every_pair(monkeypatch, flags, precompute, said):
    monkeypatch.setattr(preference, "trl_version", lambda: "1.16.0")
    choice = preference.choose_reference(TrainOptions(method="dpo", **flags), pairs=16, pairs_per_step=4)
    assert choice.precompute is precompute and said in choice.reason


def test_the_reference_cache_key_is_the_starting_model_not_its_partitions(tmp_path):
    """TRL keys its cache by a hash of the model's state_dict: under ZeRO-3 only empty placeholders, the same for
    every model of one architecture. zero_kit's key is the model itself: the embedded one's seed, a directory's
    files; and the precision the log-probabilities are computed in."""
    from types import SimpleNamespace

    args = SimpleNamespace(bf16=False, fp16=False, max_length=64)
    key = preference.reference_key
    embedded = TrainOptions(method="dpo")
    assert key(embedded, args) == key(TrainOptions(method="dpo", lora_r=8), args)  # LoRA's reference: the base
    assert key(embedded, args) != key(TrainOptions(method="dpo", seed=1), args)
    assert key(embedded, args) != key(embedded, SimpleNamespace(bf16=True, fp16=False, max_length=64))
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"weights")
    first = key(TrainOptions(method="dpo", model=str(model)), args)
    assert first == key(TrainOptions(method="dpo", model=str(model)), args)
    (model / "model.safetensors").write_bytes(b"other weights")  # fine-tuned again in place
    assert key(TrainOptions(method="dpo", model=str(model)), args) != first


def test_setup_extra_is_the_range_the_run_checks():
    tree = ast.parse((ROOT / "setup.py").read_text())
    trl = next(n for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "TRL")
    assert ast.literal_eval(trl.value) == "trl" + ",".join(preference.TRL_TESTED)


def test_bad_first_rows_are_said_before_any_work(tmp_path):
    from zero_kit.train.guards.inputs import check_inputs

    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps(PLAIN) + "\n" + json.dumps({**PLAIN, "rejected": PLAIN["chosen"]}) + "\n")
    with pytest.raises(UserError, match=r"--data .*pairs.jsonl: row 2 \(line 2\): 'chosen' equals 'rejected'"):
        check_inputs(TrainOptions(method="dpo", data=str(path), output=str(tmp_path / "out")))


def test_progress_line_and_log_carry_the_reward_figures(tmp_path, capsys):
    from zero_kit.train.callbacks import ProgressCallback

    state = SimpleNamespace(is_world_process_zero=True, global_step=2, max_steps=10, epoch=0.1,
                            num_input_tokens_seen=100)  # fmt: skip
    logs = {"loss": 0.61, "rewards/margins": 0.25, "rewards/accuracies": 0.75, "rewards/chosen": 0.1,
            "rewards/rejected": -0.15}  # fmt: skip
    callback = ProgressCallback(tmp_path, SimpleNamespace())
    callback.on_log(None, state, None, logs=logs)
    record = json.loads((tmp_path / "train_log.jsonl").read_text())
    assert (record["reward_margin"], record["reward_accuracy"]) == (0.25, 0.75)
    assert "margin 0.2500  acc 0.75  chosen 0.1000  rejected -0.1500" in capsys.readouterr().out


def _dpo_plan(**work) -> dict:
    from zero_kit.plan import GIB, KNOWN_SHAPES, Hardware, Workload, make_plan

    shape = KNOWN_SHAPES["llama-3-8b"]
    plan = make_plan(Workload(shape, shape.n_params, 2048, 1, "bf16", **work), Hardware(80 * GIB, 8, 1), layouts=[])
    return {option.label: option for option in plan.options}


def test_the_planner_counts_the_reference_and_two_sequences_per_pair():
    """`zero-kit plan --method dpo` (and the memory check of a DPO run), Llama-3-8B on 8 x 80 GB: the frozen
    reference's weights, aΨ/N at ZeRO-3 and aΨ at ZeRO-2 (TRL's stage 0), none with LoRA, on the host with
    parameter offload; activations of twice the sequences; the reference's forward in the step time."""
    from zero_kit.plan import KNOWN_SHAPES, Workload
    from zero_kit.plan.memory import activation_terms
    from zero_kit.plan.timing import compute_seconds, precompute_seconds

    shape = KNOWN_SHAPES["llama-3-8b"]
    n, sft, dpo = shape.n_params, _dpo_plan(), _dpo_plan(preference=True)
    key = "DPO reference (frozen)"
    assert (dpo["zero2"].states[key][0], dpo["zero3"].states[key][0]) == (2 * n, -(-2 * n // 8))
    assert key not in _dpo_plan(preference=True, lora_r=16)["zero3"].states
    offload = "zero3+opt+param-offload"
    assert key not in dpo[offload].states and dpo[offload].host_bytes > sft[offload].host_bytes
    pairs, doubled = Workload(shape, n, 2048, 1, preference=True), Workload(shape, n, 2048, 2)
    assert activation_terms(pairs, "zero3") == activation_terms(doubled, "zero3")
    assert not dpo["zero2"].fits and sft["zero2"].fits and dpo["zero3"].fits
    rates = SimpleNamespace(flops_per_s=1e15)
    assert compute_seconds(pairs, rates) > 2 * compute_seconds(Workload(shape, n, 2048, 1), rates)
    # --dpo-reference precompute: neither the reference's weights nor its forward (twice SFT's compute: 2 sequences)
    precomputed = _dpo_plan(preference=True, reference_precomputed=True)
    assert all(key not in option.states for option in precomputed.values())
    assert precomputed["zero3"].gpu_bytes()["total"] < dpo["zero3"].gpu_bytes()["total"]
    ahead = Workload(shape, n, 2048, 1, preference=True, reference_precomputed=True)
    assert compute_seconds(ahead, rates) == pytest.approx(compute_seconds(doubled, rates))
    # its one-off time: the reference forwards a run with the model spends on the same pairs (8 ranks, a pair each)
    per_step = compute_seconds(pairs, rates) - compute_seconds(ahead, rates)
    assert precompute_seconds(ahead, 8, rates, pairs=8 * 125) == pytest.approx(125 * per_step)


def test_plan_method_dpo_on_the_command_line(capsys):
    from zero_kit.cli import main

    assert main(["plan", "--model", "llama-3-8b", "--gpu-mem", "80GB", "--gpus-per-node", "8", "--method", "dpo"]) == 0
    shown = capsys.readouterr().out
    assert "DPO (2 sequences per pair; reference: a frozen copy of the model)" in shown
    assert "recommended: zero3" in shown
    argv = ["plan", "--model", "llama-3-8b", "--gpu-mem", "80GB", "--gpus-per-node", "8", "--method", "dpo",
            "--dpo-reference", "precompute"]  # fmt: skip
    assert main(argv) == 0
    shown = capsys.readouterr().out
    assert "reference: log-probabilities precomputed before training, no model" in shown
    assert "DPO reference precomputed before training: 20.8 s per 1,000 pairs on 8 GPU(s)" in shown
    assert main([*argv, "--json"]) == 0
    run = json.loads(capsys.readouterr().out)["run"]
    assert run["dpo_reference"] == "precompute" and run["dpo_precompute_s_per_1000_pairs"] == pytest.approx(20.8, 0.01)
    assert main(["plan", "--model", "llama-3-8b", "--gpu-mem", "80GB", "--method", "dpo", "--tp", "2"]) == 2
    assert "data-parallel layouts only" in capsys.readouterr().err


def test_an_evaluation_of_pairs_says_their_margin(tmp_path, capsys):
    from zero_kit.train.callbacks import ProgressCallback

    state = SimpleNamespace(is_world_process_zero=True, global_step=4)
    logs = {"eval_loss": 0.65, "eval_rewards/margins": 0.12, "eval_rewards/accuracies": 0.5, "eval_rewards/chosen": 0.0,
            "eval_rewards/rejected": -0.12}  # fmt: skip
    ProgressCallback(tmp_path, SimpleNamespace()).on_log(None, state, None, logs=logs)
    assert json.loads((tmp_path / "train_log.jsonl").read_text())["eval_reward_margin"] == 0.12
    assert "eval at step 4: eval loss 0.6500, reward margin 0.1200, accuracy 0.50" in capsys.readouterr().out


def test_a_dpo_run_does_not_continue_an_sft_checkpoint(tmp_path):
    from zero_kit.train.resume import RunShape, check_fits

    saved = RunShape(3, 2, "the embedded tiny LLaMA", None, "fp32")  # a record from before --method: SFT
    new = RunShape(3, 2, "the embedded tiny LLaMA", None, "fp32", method="dpo")
    with pytest.raises(UserError) as err:
        check_fits(TrainOptions(method="dpo"), saved, new, tmp_path / "checkpoint-4")
    assert "another method (sft vs dpo)" in err.value.message and "full fine-tuning, DPO" in err.value.message
    assert "--method sft" in err.value.fix
    check_fits(TrainOptions(method="dpo"), new, new, tmp_path / "checkpoint-4")
