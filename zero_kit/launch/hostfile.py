"""Hostfiles (`HOST slots=N` per line, the pdsh/deepspeed format): the one reader and the one writer, and the
environment file the deepspeed launcher hands to ranks it starts over pdsh/ssh."""

from __future__ import annotations

import os
import re
import shlex
import sys
from pathlib import Path

from zero_kit.errors import UserError
from zero_kit.launch.secrets import is_secret, write_private

_HOST = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.\-_]*$")
# Ranks started over pdsh/ssh get only what the deepspeed launcher exports (PYTHON* and the lines of
# .deepspeed_env, see write_rank_env); these are the variables a run may need there too.
# Secrets among them (HF_TOKEN) are why the file is private (secrets.write_private); other secrets (WANDB_API_KEY,
# AWS_*) are not sent: a user who needs one remotely lists it in ./.deepspeed_env.
RANK_ENV_PREFIXES = ("ZERO_KIT_", "TORCH_", "HF_", "TRANSFORMERS_", "TOKENIZERS_", "NCCL_", "GLOO_", "OMP_")
ENV_FILE = ".deepspeed_env"
SECRETS_DIR = ".deepspeed_secrets"
"""Beside ENV_FILE: one 0600 file per secret variable the ranks need (HF_TOKEN), read by the remote shell."""
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def hostfile_text(hosts: list[str], slots: int) -> str:
    """pdsh/deepspeed hostfile: one `HOST slots=N` line per node."""
    for host in hosts:
        if not _HOST.match(host):
            raise UserError(f"invalid host name {host!r} in the host list", "use plain host names or IP addresses")
    if slots < 1:
        raise UserError(f"--gpus-per-node must be at least 1, got {slots}", "pass --gpus-per-node N with N >= 1")
    return "".join(f"{host} slots={slots}\n" for host in hosts)


def parse_hostfile(text: str, source: str = "hostfile") -> list[tuple[str, int]]:
    """(host, slots) per non-comment line; every malformed line is reported at once, as SOURCE:LINE."""
    hosts, problems, seen = [], [], {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"(\S+)\s+slots=(\d+)", line)
        if not match or not _HOST.match(match.group(1)) or int(match.group(2)) < 1:
            problems.append(f"{source}:{number}: {raw.strip()!r}")
            continue
        if match.group(1) in seen:  # the launcher would start two node ranks on one host: half the ranks collide
            problems.append(f"{source}:{number}: host {match.group(1)!r} again (first on line {seen[match.group(1)]})")
            continue
        seen[match.group(1)] = number
        hosts.append((match.group(1), int(match.group(2))))
    if problems or not hosts:
        shown = (
            f"bad hostfile line {problems[0]}"
            if len(problems) == 1
            else "bad hostfile lines:\n  " + "\n  ".join(problems)
        )
        raise UserError(
            shown if problems else f"{source} lists no hosts",
            "write one 'HOST slots=N' line per node, each host once, e.g. 'node1 slots=8'",
        )
    return hosts


def read_hostfile(path: str, flag: str = "--hostfile") -> list[tuple[str, int]]:
    """The hostfile at `path`, checked: a missing file or a malformed line is the user's mistake, said with the
    flag and the line before pdsh or a launcher says something vaguer."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise UserError(f"{flag} {path}: cannot read it ({err.strerror})", "pass an existing hostfile") from None
    except UnicodeDecodeError:
        raise UserError(f"{flag} {path}: not a text file", "pass a hostfile of 'HOST slots=N' lines") from None
    return parse_hostfile(text, path)


def rank_env(environ: dict[str, str], user_file: Path = Path(ENV_FILE)) -> dict[str, str]:
    """The variables ranks started over pdsh/ssh need: those of `environ` a run may use remotely (not network
    interface names, which differ per host), PATH with this venv first, plus the user's own ./.deepspeed_env
    lines (which win)."""
    lines = {
        k: v
        for k, v in sorted(environ.items())
        if k.startswith(RANK_ENV_PREFIXES) and not k.endswith("_SOCKET_IFNAME") and "\n" not in v
    }
    # The venv first: the launcher starts the venv's python by its path, but tools the ranks call (ninja, for
    # DeepSpeed's op builds) come from PATH, and two ninja versions rebuild each other's builds every run.
    lines["PATH"] = os.pathsep.join(filter(None, [str(Path(sys.executable).parent), environ.get("PATH")]))
    if user_file.is_file():
        for raw in user_file.read_text(encoding="utf-8").splitlines():
            if "=" in raw and not raw.lstrip().startswith("#"):
                name, value = raw.split("=", 1)
                lines[name.strip()] = value
    return lines


def secret_reference(path: Path) -> str:
    """Shell that reads a secret from `path` where the command runs: what a command line (pdsh's, ssh's) carries
    instead of the value, so `ps` and logs show a path only. Unquoted: DeepSpeed's pdsh runner double-quotes a
    value with `$(` in it itself; other callers put it inside double quotes."""
    return f"$(cat {shlex.quote(str(path))})"


def rank_env_files(environ: dict[str, str], env_file: Path, user_file: Path = Path(ENV_FILE)) -> dict[Path, str]:
    """`rank_env` as DeepSpeed's env file at `env_file` (DS_ENV_FILE points at it), plus one file per secret in
    SECRETS_DIR beside it. DeepSpeed's pdsh runner puts each line on the pdsh command line (`export NAME=VALUE;`),
    which `ps` shows and DeepSpeed logs (`cmd = pdsh ...`), so a secret's line reads its value from its file on the
    remote host instead (the output directory is shared by the nodes, like the checkpoints). Every file is written
    private (write_private). No blank lines: the launcher crashes on one."""
    env_file = env_file.absolute()
    variables = rank_env(environ, user_file)
    files = secret_files(variables, env_file.parent / SECRETS_DIR)
    lines = [f"{k}={secret_reference(env_file.parent / SECRETS_DIR / k) if _kept_apart(k) else v}\n"
             for k, v in variables.items()]  # fmt: skip
    return {env_file: "".join(lines), **files}


def secret_files(variables: dict[str, str], secrets_dir: Path) -> dict[Path, str]:
    """One file per secret of `variables` (its value, no newline: `$(cat)` reads it back whole)."""
    return {secrets_dir / k: v for k, v in variables.items() if _kept_apart(k)}


def _kept_apart(name: str) -> bool:
    # A name that is no shell name (a user's odd line) stays inline: it must never become a path outside the dir.
    return is_secret(name) and bool(_NAME.match(name))


def write_rank_env(path: Path, environ: dict[str, str], user_file: Path = Path(ENV_FILE)) -> Path:
    """The ranks' environment file at `path` and its secrets' files (rank_env_files), each 0600 from its first
    byte."""
    for file, text in rank_env_files(environ, path, user_file).items():
        write_private(file, text)
    return path
