"""Issue 25 parts 1 and 2 at unit level. Secrets: which names are secrets, redaction, the ranks' environment file
private from its first byte (also over an existing wider file, under umask 0) and still where DeepSpeed's launcher
reads it. Model directories are data: an auto_map model is refused without --trust-remote-code (its planted code
never runs), export reads ZeRO shards with weights_only (a planted pickle never runs), and --resume from a
checkpoint another user owns warns. The real runs that leave files to scan are tests/dist/test_secrets_scan.py."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.mistakes import answer, assert_refused, snapshot
from zero_kit.errors import UserError
from zero_kit.launch import Launcher, from_hostfile, launch_commands, write_rank_env
from zero_kit.launch import secrets as zk_secrets
from zero_kit.launch.secrets import REDACTED, is_secret, redact, redact_argv, redact_env, write_private

PLANTED = {
    "HF_TOKEN": "hf_PLANTEDunit0123456789",
    "WANDB_API_KEY": "PLANTEDwandb42",
    "MY_SERVICE_PASSWORD": "pwPLANTED!x",
}


@pytest.mark.parametrize(
    "name",
    ["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "WANDB_API_KEY", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN",
     "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AZURE_CLIENT_SECRET", "AZURE_STORAGE_CONNECTION_STRING",
     "AZURE_STORAGE_KEY", "GOOGLE_APPLICATION_CREDENTIALS", "MY_SERVICE_PASSWORD", "GITHUB_TOKEN", "OPENAI_API_KEY",
     "DB_SECRET", "client_secret_value", "SECRET_KEY"],
)  # fmt: skip
def test_secret_names(name):
    assert is_secret(name)


@pytest.mark.parametrize(
    "name", ["TOKENIZERS_PARALLELISM", "HF_HOME", "HF_HUB_OFFLINE", "PATH", "NCCL_DEBUG", "MASTER_PORT", "TOKEN_LIMIT"]
)
def test_plain_names(name):
    assert not is_secret(name)


def test_redaction_keeps_names_and_drops_values():
    environ = {**PLANTED, "HF_HOME": "/data/hf", "OMP_NUM_THREADS": "1"}
    assert redact_env(environ) == {**dict.fromkeys(PLANTED, REDACTED), "HF_HOME": "/data/hf", "OMP_NUM_THREADS": "1"}
    text = f"token {PLANTED['HF_TOKEN']} in a line; export WANDB_API_KEY=whatever-it-is; HF_HOME=/data/hf"
    shown = redact(text, environ)
    assert PLANTED["HF_TOKEN"] not in shown and "whatever-it-is" not in shown
    assert "WANDB_API_KEY=<redacted>" in shown and "HF_HOME=/data/hf" in shown
    argv = redact_argv(["env", f"HF_TOKEN={PLANTED['HF_TOKEN']}", "torchrun", "--data", "x.jsonl"], environ)
    assert argv == ["env", "HF_TOKEN=<redacted>", "torchrun", "--data", "x.jsonl"]


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_private_file_is_0600_before_its_first_byte(tmp_path, monkeypatch, umask_zero):
    """Under umask 0, and over an existing world-readable file: the mode is 0600 when the first byte is written."""
    seen = []
    real_write = os.write

    def watching_write(fd, data):
        seen.append(stat.S_IMODE(os.fstat(fd).st_mode))
        return real_write(fd, data)

    monkeypatch.setattr(zk_secrets.os, "write", watching_write)
    fresh = write_private(tmp_path / "new" / ".deepspeed_env", "HF_TOKEN=x\n")
    wide = tmp_path / "wide"
    wide.write_text("old and longer content\n")
    wide.chmod(0o666)
    write_private(wide, "HF_TOKEN=y\n")
    assert seen and set(seen) == {0o600}
    assert _mode(fresh) == 0o600 and _mode(wide) == 0o600 and wide.read_text() == "HF_TOKEN=y\n"


def test_private_file_never_follows_a_planted_link(tmp_path):
    target = tmp_path / "elsewhere"
    (tmp_path / ".deepspeed_env").symlink_to(target)
    with pytest.raises(UserError, match=r"\.deepspeed_env: cannot create it as a private file"):
        write_private(tmp_path / ".deepspeed_env", "HF_TOKEN=x\n")
    assert not target.exists()


def _hostfile_launch(tmp_path: Path, launcher: Launcher, environ: dict[str, str]):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node1 slots=1\nnode2 slots=1\n")
    return launch_commands("zero_kit.cli", ["train"], from_hostfile(str(hostfile)), launcher, port=29500,
                           run_dir=tmp_path / "out", environ=environ)  # fmt: skip


def _shell_sees(script: str, name: str) -> str:
    done = subprocess.run(["sh", "-c", f'{script} printf %s "${name}"'], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_remote_ranks_get_the_token_from_a_private_file_never_from_a_command_line(tmp_path, umask_zero):
    """The env file names HF_TOKEN's file; DeepSpeed's own pdsh runner, fed that file as runner.py reads it, builds
    a pdsh command without the value, and the remote shell (sh here) reads the value back."""
    from deepspeed.launcher.multinode_runner import PDSHRunner
    from deepspeed.launcher.runner import parse_args

    environ = {**PLANTED, "HF_HOME": "/data/hf", "PATH": "/usr/bin"}
    runner = Launcher("deepspeed", program=("py", "-m", "deepspeed.launcher.runner"), no_local_rank=True)
    launch = _hostfile_launch(tmp_path, runner, environ)
    launch.write_files()
    env_file = Path(launch.env["DS_ENV_FILE"])
    # runner.py: os.path.join(home or ".", DS_ENV_FILE); an absolute name wins over both.
    assert env_file.is_absolute() and os.path.join(os.path.expanduser("~"), str(env_file)) == str(env_file)
    secret_file = env_file.parent / ".deepspeed_secrets" / "HF_TOKEN"
    assert secret_file.read_text() == PLANTED["HF_TOKEN"] and PLANTED["HF_TOKEN"] not in env_file.read_text()
    assert "WANDB_API_KEY" not in env_file.read_text()  # not a rank variable: never sent
    assert all(_mode(path) == 0o600 for path in launch.files)
    pdsh = PDSHRunner(parse_args(["--hostfile", "h", "x.py"]), "e30=")
    for line in env_file.read_text().splitlines(keepends=True):  # as runner.py reads DS_ENV_FILE
        pdsh.add_export(*line.split("=", maxsplit=1))
    cmd, _, _ = pdsh.get_cmd({}, {"node1": [0], "node2": [0]})
    exports = next(word for word in cmd if word.startswith("export "))
    assert PLANTED["HF_TOKEN"] not in " ".join(cmd)
    assert _shell_sees(exports, "HF_TOKEN") == PLANTED["HF_TOKEN"]
    direct = write_rank_env(tmp_path / "direct" / ".deepspeed_env", environ, user_file=tmp_path / "none")
    assert _mode(direct) == 0o600 and _mode(direct.parent / ".deepspeed_secrets" / "HF_TOKEN") == 0o600


def test_ssh_torchrun_reads_the_token_on_the_remote_host(tmp_path, umask_zero):
    torchrun = Launcher("torchrun")
    launch = _hostfile_launch(tmp_path, torchrun, {**PLANTED, "PATH": "/usr/bin"})
    launch.write_files()
    remote = launch.argvs[1][-1]
    assert not any(value in " ".join(argv) for value in PLANTED.values() for argv in launch.argvs)
    before_torchrun = remote[: remote.index(sys.executable)]  # `cd DIR && env A=1 ... HF_TOKEN="$(cat FILE)" `
    assert _shell_sees(f"{before_torchrun} sh -c 'printf %s \"$HF_TOKEN\"' #", "HF_TOKEN") == PLANTED["HF_TOKEN"]


def _evil_model_dir(root: Path, marker: Path, where: str = "config.json") -> Path:
    """A tiny LLaMA directory whose `where` names a planted module (auto_map) that writes `marker` if imported."""
    from zero_kit.model import load_tokenizer, tiny_llama_config

    model_dir = root / "evil_model"
    model_dir.mkdir()
    tiny_llama_config(num_hidden_layers=1).save_pretrained(model_dir)
    load_tokenizer(None).save_pretrained(model_dir)
    (model_dir / "modeling_evil.py").write_text(
        f"open({str(marker)!r}, 'w').write('ran')\nfrom transformers import LlamaConfig as EvilConfig\n"
        "from transformers import LlamaForCausalLM as EvilForCausalLM\n"
        "from transformers import PreTrainedTokenizerFast as EvilTokenizer\n"
    )
    data = json.loads((model_dir / where).read_text())
    data["auto_map"] = (
        {"AutoConfig": "modeling_evil.EvilConfig", "AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"}
        if where == "config.json"
        else {"AutoTokenizer": [None, "modeling_evil.EvilTokenizer"]}
    )
    (model_dir / where).write_text(json.dumps(data))
    return model_dir


@pytest.mark.parametrize("where", ["config.json", "tokenizer_config.json"])
def test_auto_map_model_is_refused_and_its_code_never_runs(tmp_path, where):
    from zero_kit.model import build_config, load_model, load_tokenizer

    marker = tmp_path / "ran"
    model_dir = str(_evil_model_dir(tmp_path, marker, where))
    loaders = [load_tokenizer] if where == "tokenizer_config.json" else [build_config, load_model, load_tokenizer]
    for load in loaders:
        with pytest.raises(UserError) as err:
            load(model_dir)
        assert "--trust-remote-code" in err.value.fix and where in str(err.value) and "auto_map" in str(err.value)
    assert not marker.exists()


@pytest.mark.parametrize("extra", [[], ["--nproc", "2"]])
def test_train_refuses_an_auto_map_model_before_any_rank(tmp_path, extra):
    marker = tmp_path / "ran"
    model_dir = _evil_model_dir(tmp_path, marker)
    out = tmp_path / "out"
    before = snapshot(tmp_path)
    found = answer("train", "--model", str(model_dir), "--output", str(out), "--max-steps", "1", *extra)
    assert_refused(found, "--trust-remote-code", "auto_map", "config.json")
    assert not marker.exists() and snapshot(tmp_path) == before


def _planted_pickle(path: Path, marker: Path) -> None:
    import torch

    class Evil:
        def __reduce__(self):
            return (exec, (f"open({str(marker)!r}, 'w').write('ran')",))

    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"buffer_names": [], "optimizer_state_dict": Evil()}, path)


def _fake_checkpoint(root: Path, marker: Path, model: str | None) -> Path:
    """A checkpoint-1 that passes the manifest check, whose ZeRO shards are planted pickles."""
    from zero_kit.checkpoints import store

    ckpt = root / "run" / "checkpoint-1"
    _planted_pickle(ckpt / "global_step1" / "mp_rank_00_model_states.pt", marker)
    _planted_pickle(ckpt / "global_step1" / "zero_pp_rank_0_mp_rank_00_optim_states.pt", marker)
    (ckpt / "latest").write_text("global_step1")
    (ckpt / store.RUN_INFO).write_text(json.dumps({"options": {"model": model}}))
    store.write_manifest(ckpt, step=1, world_size=1)
    return ckpt


def test_export_never_unpickles_code_from_a_checkpoint(tmp_path):
    marker = tmp_path / "ran"
    ckpt = _fake_checkpoint(tmp_path, marker, None)
    found = answer("export", str(ckpt), "--out", str(tmp_path / "exported"))
    assert_refused(found, "weights_only", str(ckpt), within_s=90)
    assert not marker.exists()


def test_export_refuses_an_auto_map_model_before_reading_shards(tmp_path):
    marker = tmp_path / "ran"
    model_dir = _evil_model_dir(tmp_path, marker)
    ckpt = _fake_checkpoint(tmp_path, marker, str(model_dir))
    found = answer("export", str(ckpt), "--out", str(tmp_path / "exported"))
    assert_refused(found, "--trust-remote-code", "auto_map", within_s=90)
    assert not marker.exists()


def test_resume_from_a_checkpoint_another_user_owns_warns(tmp_path, monkeypatch):
    from zero_kit import model as zk_model

    ckpt = tmp_path / "checkpoint-4"
    (ckpt / "global_step4").mkdir(parents=True)
    (ckpt / "global_step4" / "mp_rank_00_model_states.pt").write_bytes(b"x")
    assert zk_model.foreign_warning(ckpt, "--resume") is None
    monkeypatch.setattr(os, "getuid", lambda: ckpt.stat().st_uid + 1)  # as if another user had written it
    warning = zk_model.foreign_warning(ckpt, "--resume")
    assert warning is not None and f"--resume {ckpt}: owned by another user" in warning and "pickles" in warning
