"""Training data prepared once and kept (issue 23): tokenized, masked, split and packed by zero_kit.data.pipeline
into Arrow files under a cache directory, then memory-mapped by every rank (`Dataset.from_file`): no rank holds
the data as Python lists, and a second start with the same inputs tokenizes nothing.

- The key is a hash of everything the prepared data depends on (`key_material`): the data files' bytes, the
  tokenizer's files, --format, --max-length, --pack, --skip-bad, the --val-size/--seed split, the alpaca prompts,
  zero_kit's DATA_FORMAT_VERSION and the versions of datasets, transformers and tokenizers. A chat template lives in
  the tokenizer's files. Any change is another key, so a stale entry is never read; old entries stay until deleted.
- Who prepares: whoever takes the key's lock first (an flock on KEY.lock beside the entry; zero_kit.launch.ops
  `owner_lock`); everyone else waits on it, then finds the entry ready. `zero-kit train` prepares in the launching
  process, before any launcher starts, so ranks only load; under an outside launcher one process per cache prepares.
- An entry is built in a private directory beside its final place (.tmp-KEY-HOST-PID) and published by one atomic
  rename, so a half-written entry is never seen. A preparer that died (a crash, kill -9) let go of its flock with
  its life: the next holder removes its partial directory and builds again. Without flock (some network
  filesystems) nothing is waited on or removed: each process builds privately and the first rename wins.
- An entry's Arrow file holds record batches of up to ROWS_PER_BATCH rows. Mapping a file reads every batch's
  header, and each read maps ~64 KiB of the page cache into the rank (the kernel's fault-around). `save_to_disk`
  writes 1,000-row batches, so at 1M rows each rank held 66 MiB of the file resident, against ~2 MiB now.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from zero_kit.data.files import Rows
from zero_kit.data.pipeline import DataStats, Split, build_parts
from zero_kit.data.preference import PAIR_TOKENIZATION, PAIRS, build_pairs
from zero_kit.errors import UserError
from zero_kit.log import warn

DATA_FORMAT_VERSION = 2  # 2: one Arrow file per split, in ROWS_PER_BATCH-row batches (1: save_to_disk)
"""Raise it whenever what an entry holds, or how rows become examples, changes: older entries are then not read."""
META = "zero_kit_data.json"  # an entry's stats and key material, written last before the rename
SPLITS = {"train": "train.arrow", "eval": "eval.arrow"}  # the --val-size hold-out is "eval"
ROWS_PER_BATCH = 65_536
"""Rows per record batch in an entry's file: a few batches even at 1M rows. The writer holds one batch at a time:
~35 MB of alpaca rows at --max-length 256, up to ~220 MB when --pack fills every row."""
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf", ".onnx", ".npz")
"""Files of a model directory that are not the tokenizer's: left out of the key (hashing gigabytes would be slow)."""


@dataclass(frozen=True)
class DataSpec:
    """What one prepared dataset is made from. paths: as the user gave them (bad rows are named that way);
    tokenizer_dir: the directory the tokenizer is loaded from."""

    paths: tuple[str, ...]
    fmt: str
    max_length: int
    pack: bool
    skip_bad: bool
    tokenizer_dir: str
    split: Split | None = None


def default_cache_dir(environ: dict[str, str] | None = None) -> Path:
    """$HF_DATASETS_CACHE/zero_kit, where the Hugging Face libraries keep datasets (on clusters HF_HOME usually
    points at a large shared disk): HF_DATASETS_CACHE, else HF_HOME/datasets, else XDG_CACHE_HOME or ~/.cache."""
    environ = os.environ if environ is None else environ
    if environ.get("HF_DATASETS_CACHE"):
        return Path(environ["HF_DATASETS_CACHE"]).expanduser() / "zero_kit"
    if environ.get("HF_HOME"):
        return Path(environ["HF_HOME"]).expanduser() / "datasets" / "zero_kit"
    cache = Path(environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser()
    return cache / "huggingface" / "datasets" / "zero_kit"


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while block := file.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def _files(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]


def data_digests(paths: tuple[str, ...]) -> list[list[str]]:
    """[path as given, file inside (for a directory), sha256 of its bytes] for every data file."""
    found = []
    for given in paths:
        root = Path(given)
        for file in _files(root):
            found.append([given, str(file.relative_to(root)) if root.is_dir() else "", file_digest(file)])
    return found


def tokenizer_digests(tokenizer_dir: str) -> dict[str, str]:
    """sha256 of each file directly in the tokenizer's directory but the weights (also code, configs, templates:
    anything a tokenizer may read), and of additional_chat_templates/."""
    root = Path(tokenizer_dir)
    files = [p for p in root.iterdir() if p.is_file() and not p.name.endswith(WEIGHT_SUFFIXES)]
    files += _files(root / "additional_chat_templates") if (root / "additional_chat_templates").is_dir() else []
    return {str(p.relative_to(root)): file_digest(p) for p in sorted(files)}


def key_material(spec: DataSpec) -> dict:
    from importlib.metadata import version

    from zero_kit.data.formats import ALPACA_PROMPT, ALPACA_PROMPT_WITH_INPUT

    return {
        **({"pair_tokenization": PAIR_TOKENIZATION} if spec.fmt == PAIRS else {}),  # --method dpo's pairs
        "version": DATA_FORMAT_VERSION,
        "data": data_digests(spec.paths),
        "format": spec.fmt,
        "max_length": spec.max_length,
        "pack": spec.pack,
        "skip_bad": spec.skip_bad,
        "split": None if spec.split is None else asdict(spec.split),
        "tokenizer": tokenizer_digests(spec.tokenizer_dir),
        "prompts": [ALPACA_PROMPT, ALPACA_PROMPT_WITH_INPUT],
        "libraries": {name: version(name) for name in ("datasets", "transformers", "tokenizers")},
    }


def cache_key(spec: DataSpec) -> str:
    return hashlib.sha256(json.dumps(key_material(spec), sort_keys=True).encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Entry:
    """One prepared dataset in the cache: `built` by this process (else found ready), in `seconds`."""

    path: Path
    built: bool
    seconds: float = 0.0

    def train_rows(self) -> int:
        """Rows of the training split (after a --val-size hold-out), counted from its Arrow file's batches without
        datasets' import."""
        import pyarrow as pa

        with pa.memory_map(str(self.path / SPLITS["train"])) as source:
            return sum(batch.num_rows for batch in pa.ipc.open_stream(source))

    def load(self):
        """(train Dataset, eval Dataset or None, DataStats), memory-mapped from the entry's Arrow files."""
        from datasets import Dataset

        try:
            meta = json.loads((self.path / META).read_text(encoding="utf-8"))
            train = Dataset.from_file(str(self.path / SPLITS["train"]))
            eval_file = self.path / SPLITS["eval"]
            held = Dataset.from_file(str(eval_file)) if eval_file.is_file() else None
        except (OSError, ValueError) as err:  # a damaged entry (files deleted by hand, a full disk meanwhile)
            raise UserError(
                f"data cache entry {self.path}: unreadable ({type(err).__name__}: {err})",
                f"delete {self.path} (zero-kit prepares it again), or pass another --data-cache",
            ) from None
        stats = DataStats(**{**meta["stats"], "skipped": Counter(meta["stats"]["skipped"])})
        return train, held, stats


def _complete(path: Path) -> bool:
    return (path / META).is_file()


def prepared(spec: DataSpec, cache_dir: Path, load_rows: Callable[[], Rows], load_tokenizer: Callable) -> Entry:
    """The cache entry of `spec`: found ready, or built here (rows first: a file that does not parse is said before
    the tokenizer's import) while any other process that wants the same key waits."""
    from zero_kit.launch.ops import owner_lock

    material = key_material(spec)
    key = hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:32]
    final = cache_dir / key
    if _complete(final):
        return Entry(final, built=False)
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"--data-cache {cache_dir}: cannot create ({err.strerror or err})",
                        "pass --data-cache DIR on a writable disk") from None  # fmt: skip
    asked = time.time()
    with owner_lock(cache_dir / f"{key}.lock", "data preparation") as locked:
        if _complete(final):
            return Entry(final, built=False)
        _raise_recorded_failure(cache_dir / f"{key}.failed", asked)
        if locked:  # nobody else prepares this key now: what its directories hold was left by the dead
            _clear_partials(cache_dir, key)
        return _build(spec, material, final, load_rows, load_tokenizer)


def _build(spec: DataSpec, material: dict, final: Path, load_rows: Callable[[], Rows], load_tokenizer) -> Entry:
    start = time.monotonic()
    tmp = final.parent / f".tmp-{final.name}-{socket.gethostname()}-{os.getpid()}"
    try:
        rows = load_rows()
        if not spec.skip_bad:
            rows.refuse_unparsed()  # a line that is not JSON, said before the tokenizer's import
        (tmp / "work").mkdir(parents=True)
        warn(f"zero-kit: preparing {len(rows):,} rows of {', '.join(spec.paths)} into {final}")
        build = build_pairs if spec.fmt == PAIRS else build_parts  # --method dpo's pairs, or the SFT formats
        train, held, stats = build(rows, load_tokenizer(), spec.fmt, spec.max_length, skip_bad=spec.skip_bad,
                                   pack=spec.pack, split=spec.split, workdir=tmp / "work")  # fmt: skip
        for split, dataset in (("train", train), ("eval", held)):
            if dataset is not None:
                write_arrow(dataset, tmp / SPLITS[split])
        del train, held
        shutil.rmtree(tmp / "work")
        counts = {**vars(stats), "skipped": dict(stats.skipped)}  # asdict() would rebuild the Counter from pairs
        meta = {"stats": counts, "key": material, "host": socket.gethostname(), "created": time.time()}
        (tmp / META).write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
        _publish(tmp, final)
    except UserError as err:  # the inputs' own fault: whoever waited on this key gets it too, not a second try
        failed = {"message": err.message, "fix": err.fix}
        (final.parent / f"{final.name}.failed").write_text(json.dumps(failed), encoding="utf-8")
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone after the rename; a failure leaves nothing behind
    return Entry(final, built=True, seconds=time.monotonic() - start)


def write_arrow(dataset, path: Path) -> None:
    """`dataset`'s rows (its indices mapping applied) into one Arrow stream file that `Dataset.from_file` maps, its
    features in the schema, in record batches of up to ROWS_PER_BATCH rows (see the module's docstring)."""
    from datasets.arrow_writer import ArrowWriter

    writer = ArrowWriter(features=dataset.features, path=str(path), writer_batch_size=ROWS_PER_BATCH)
    try:
        for table in dataset.with_format("arrow").iter(ROWS_PER_BATCH):
            writer.write_table(table, ROWS_PER_BATCH)
        writer.finalize()
    finally:
        writer.close()


def _publish(tmp: Path, final: Path) -> None:
    """One rename makes the entry visible, whole. Another process's entry there already (a filesystem without
    flock lets two build) is as good as ours: ours goes."""
    try:
        os.rename(tmp, final)
    except OSError:
        if not _complete(final):
            raise
    (final.parent / f"{final.name}.failed").unlink(missing_ok=True)


def _raise_recorded_failure(record: Path, since: float) -> None:
    """The preparation this process waited for failed on the inputs: the same error, not a second try of it."""
    try:
        if record.stat().st_mtime < since:
            return  # an earlier run's: try again
        failed = json.loads(record.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    raise UserError(failed["message"], failed["fix"])


def _clear_partials(cache_dir: Path, key: str) -> None:
    for partial in sorted(cache_dir.glob(f".tmp-{key}-*")):
        shutil.rmtree(partial, ignore_errors=True)
        warn(f"zero-kit: removed {partial}, a preparation cut short (its process is gone)")
