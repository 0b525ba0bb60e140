"""Which environment variables are secrets, in one place, and the two things done with them: files that must carry
them are private to the user from their first byte (`write_private`), and anything shown or recorded carries their
names only (`redact`, `redact_env`, `redact_argv`).

A remote rank started over pdsh/ssh needs e.g. HF_TOKEN to read a gated model, so the ranks' environment file
(.deepspeed_env, in the output directory, often on a shared filesystem) holds it: that file is 0600.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from zero_kit.errors import UserError

# Patterns: the conventions of nearly every service's client (FOO_TOKEN, FOO_API_KEY, FOO_SECRET_KEY, FOO_PASSWORD).
_SECRET_NAME = re.compile(r"(_TOKEN$|_API_KEY$|_SECRET|SECRET_|PASSWORD|PASSWD|_ACCESS_KEY|_PRIVATE_KEY|_CREDENTIALS$)")
KNOWN_SECRETS = frozenset(
    {
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "HUGGINGFACE_TOKEN",
        "WANDB_API_KEY",
        "MLFLOW_TRACKING_PASSWORD",
        "MLFLOW_TRACKING_TOKEN",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AZURE_CLIENT_SECRET",
        "AZURE_STORAGE_CONNECTION_STRING",
        "AZURE_STORAGE_KEY",
        "AZURE_STORAGE_SAS_TOKEN",
        # Google: a path to a key file, not the key; the path still tells where the key lies, so it is kept quiet.
        "GOOGLE_APPLICATION_CREDENTIALS",
        "GOOGLE_API_KEY",
        "GCS_OAUTH_TOKEN",
        "COMET_API_KEY",
        "NEPTUNE_API_TOKEN",
    }
)
REDACTED = "<redacted>"
PRIVATE_MODE = 0o600
# Values shorter than this are not searched for in free text: "1" or "true" would redact half a log line.
_MIN_VALUE_LEN = 6


def is_secret(name: str) -> bool:
    """True for a variable whose value must never be shown or written where others can read it."""
    upper = name.upper()
    return upper in KNOWN_SECRETS or bool(_SECRET_NAME.search(upper))


def secret_values(environ: Mapping[str, str]) -> list[str]:
    """The values of the secrets in `environ`, longest first (so a value containing another is replaced whole)."""
    values = {v for k, v in environ.items() if is_secret(k) and len(v) >= _MIN_VALUE_LEN}
    return sorted(values, key=len, reverse=True)


def redact_env(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` with every secret's value replaced (its name stays: a reader may need to know it was set)."""
    return {k: REDACTED if is_secret(k) else v for k, v in environ.items()}


def redact(text: str, environ: Mapping[str, str] | None = None) -> str:
    """`text` with the value of every secret of `environ` (default os.environ) replaced, and NAME=VALUE forms of
    secret names replaced whatever their value."""
    environ = os.environ if environ is None else environ
    for value in secret_values(environ):
        text = text.replace(value, REDACTED)
    return re.sub(r"\b([A-Za-z_][A-Za-z0-9_]*)=(\S+)", _redact_assignment, text)


def _redact_assignment(match: re.Match) -> str:
    name = match.group(1)
    return f"{name}={REDACTED}" if is_secret(name) else match.group(0)


def redact_argv(argv: Iterable[str], environ: Mapping[str, str] | None = None) -> list[str]:
    """An argv safe to print: each word redacted (`env HF_TOKEN=... cmd`, a token passed as a value)."""
    return [redact(word, environ) for word in argv]


def write_private(path: Path, text: str) -> Path:
    """Write `text` to `path` readable by the user alone: the file is opened with mode 0600 and fchmod-ed to 0600
    before the first byte (also when it already existed with a wider mode, or the umask is 0), so there is no
    moment at which another user could open it. Truncated and rewritten in place: a reader never sees a mix."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # O_NOFOLLOW: a link planted at this name in a shared directory must not redirect the secrets elsewhere.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, PRIVATE_MODE)
    except OSError as err:
        raise UserError(
            f"{path}: cannot create it as a private file ({err.strerror})",
            "remove it (a link, or a file of another user, is not overwritten) or choose another --output",
        ) from None
    try:
        os.fchmod(fd, PRIVATE_MODE)
        os.ftruncate(fd, 0)
        data = text.encode("utf-8")
        while data:
            data = data[os.write(fd, data) :]
    finally:
        os.close(fd)
    return path
