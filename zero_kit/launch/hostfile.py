"""Hostfiles (`HOST slots=N` per line, the pdsh/deepspeed format): the one reader and the one writer, and the
environment file the deepspeed launcher hands to ranks it starts over pdsh/ssh."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from zero_kit.errors import UserError

_HOST = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.\-_]*$")
# Ranks started over pdsh/ssh get only what the deepspeed launcher exports (PYTHON* and the lines of
# .deepspeed_env, see write_rank_env); these are the variables a run may need there too.
RANK_ENV_PREFIXES = ("ZERO_KIT_", "TORCH_", "HF_", "TRANSFORMERS_", "TOKENIZERS_", "NCCL_", "GLOO_", "OMP_")
ENV_FILE = ".deepspeed_env"


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


def rank_env_text(environ: dict[str, str], user_file: Path = Path(ENV_FILE)) -> str:
    """`rank_env` as DeepSpeed's env file (DS_ENV_FILE points at it). No blank lines: the launcher crashes on one."""
    return "".join(f"{k}={v}\n" for k, v in rank_env(environ, user_file).items())


def write_rank_env(path: Path, environ: dict[str, str], user_file: Path = Path(ENV_FILE)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(rank_env_text(environ, user_file), encoding="utf-8")
    return path
