"""Reading training rows from JSONL / JSON / CSV / Parquet files, directories of them and `datasets.save_to_disk`
directories.

JSON and JSONL are parsed with the standard library, line by line, so an error names the exact line and a
row with a wrong type stays one bad row (pyarrow's JSON reader would fail the whole file on the first type
change). A JSONL line that is not JSON (or not UTF-8) is kept in its place as an `Unparsed` row: refused with its
line (`Rows.refuse_unparsed`) unless --skip-bad skips and counts it like any other bad row. A JSON file is one
document, so a syntax error in it has no rows around it to keep: it is refused, --skip-bad or not. CSV, Parquet and
saved directories go through pandas/pyarrow into a `datasets.Dataset`. Any file that cannot be read becomes a
`UserError` naming the file (and the line where one is known). A directory that is not a saved dataset is read as
its data files (`data_files`: each file directly in it with a known extension, in name order), one dataset.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zero_kit.errors import UserError

SUFFIXES = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "json",
    ".csv": "csv",
    ".parquet": "parquet",
    ".pq": "parquet",
}
SUPPORTED = "JSONL, JSON, CSV, Parquet files or a datasets.save_to_disk directory"


@dataclass(frozen=True)
class Unparsed:
    """A JSONL line that could not be read as JSON, kept as a row in its place: what --skip-bad skips and counts."""

    line: int
    detail: str
    """e.g. "not valid JSON (Expecting value, column 1)"."""
    fix: str

    def error(self, path: str) -> UserError:
        return UserError(f"{path}: line {self.line}: {self.detail}", self.fix)


SKIP_LINES = "or pass --skip-bad to skip and count such lines"


@dataclass
class RowSource:
    """The rows of one file, with enough bookkeeping to point at a row in an error message."""

    path: str
    kind: str
    rows: Sequence[Any]
    columns: list[str]
    lines: list[int] | None = None
    unparsed: list[int] = field(default_factory=list)
    """Indices of the rows that are Unparsed lines."""

    def where(self, index: int) -> str:
        line = f" (line {self.lines[index]})" if self.lines else ""
        return f"{self.path}: row {index + 1}{line}"


@dataclass
class Rows:
    """Rows from one or more files in one format; iterate to get (source, index, row)."""

    sources: list[RowSource]
    fmt: str = ""
    _count: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self._count = sum(len(source.rows) for source in self.sources)

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[tuple[RowSource, int, Any]]:
        return self.span(0, self._count)

    def refuse_unparsed(self) -> None:
        """The first line that is not JSON, as its UserError (where bad rows are not skipped)."""
        for source in self.sources:
            if source.unparsed:
                raise source.rows[source.unparsed[0]].error(source.path)

    def locate(self, position: int) -> tuple[RowSource, int]:
        """The source and the index in it of the row at `position` (counted over all sources)."""
        for source in self.sources:
            if position < len(source.rows):
                return source, position
            position -= len(source.rows)
        raise IndexError(position)

    def span(self, start: int, stop: int) -> Iterator[tuple[RowSource, int, Any]]:
        """(source, index, row) for the rows at positions start..stop-1."""
        offset = 0
        for source in self.sources:
            size = len(source.rows)
            for index in range(max(start - offset, 0), min(stop - offset, size)):
                try:
                    row = source.rows[index]
                except Exception as err:  # arrow data that decodes badly only when a row is read
                    raise UserError(
                        f"{source.where(index)}: unreadable ({type(err).__name__}: {err})", "rewrite the file"
                    ) from None
                yield source, index, row
            offset += size


def _decode(path: str, data: bytes) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise UserError(
            f"{path}: line {line}: not valid UTF-8 (byte offset {err.start})", "save the file as UTF-8"
        ) from None


LINE_FIX = "fix or remove that line; a JSONL file holds one complete JSON object per line"
DOCUMENT_FIX = (
    "fix it there: a JSON file is one document, so --skip-bad (which skips bad rows and JSONL lines) cannot skip"
    " into it; or save the rows as JSONL, one object per line"
)


def _json_value(path: str, text: str, line: int | None) -> Any:
    """`text` parsed; a UserError naming the place (line: a JSONL line; None: a whole JSON document)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        at = f"line {line}" if line else f"line {err.lineno}"
        raise UserError(
            f"{path}: {at}: not valid JSON ({err.msg}, column {err.colno})", LINE_FIX if line else DOCUMENT_FIX
        ) from None
    except (ValueError, RecursionError) as err:  # huge integers, absurd nesting
        where = f"line {line}: " if line else ""
        raise UserError(f"{path}: {where}JSON that cannot be read ({type(err).__name__})", "fix the value") from None


def _jsonl_row(path: str, data: bytes, line: int, offset: int) -> Any:
    """One JSONL line's row, or Unparsed (not UTF-8, not JSON) with the words and fix of the error it would be."""
    try:
        text = data.decode("utf-8-sig" if line == 1 else "utf-8")
    except UnicodeDecodeError as err:
        detail = f"not valid UTF-8 (byte offset {offset + err.start})"
        return Unparsed(line, detail, f"save the file as UTF-8, {SKIP_LINES}")
    if not text.strip():
        return None
    try:
        return _json_value(path, text, line)
    except UserError as err:
        detail = err.message.split(f"line {line}: ", 1)[-1]
        return Unparsed(line, detail, f"{err.fix}, {SKIP_LINES}")


def _columns(rows: Sequence[Any]) -> list[str]:
    names: dict[str, None] = {}
    for row in rows:
        if isinstance(row, dict):
            names.update(dict.fromkeys(str(key) for key in row))
    return list(names)


def read_jsonl(path: str) -> RowSource:
    rows, lines, unparsed, offset = [], [], [], 0
    for number, data in enumerate(Path(path).read_bytes().split(b"\n"), 1):
        row = _jsonl_row(path, data, number, offset) if data.strip() else None
        offset += len(data) + 1
        if row is None:
            continue
        if isinstance(row, Unparsed):
            unparsed.append(len(rows))
        rows.append(row)
        lines.append(number)
    return RowSource(path, "jsonl", rows, _columns(rows), lines, unparsed)


def read_json(path: str) -> RowSource:
    text = _decode(path, Path(path).read_bytes())
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        if err.msg == "Extra data":  # JSON Lines saved with a .json name
            return read_jsonl(path)
        value = _json_value(path, text, None)
    except (ValueError, RecursionError):
        value = _json_value(path, text, None)
    if isinstance(value, dict) and value and all(isinstance(v, list) for v in value.values()):
        lengths = {len(v) for v in value.values()}
        if len(lengths) == 1:  # column-oriented: {"instruction": [...], "output": [...]}
            value = [dict(zip(value, items, strict=True)) for items in zip(*value.values(), strict=True)]
    if not isinstance(value, list):
        raise UserError(
            f"{path}: expected a JSON list of row objects, got {type(value).__name__}",
            "write [{...}, {...}] or use JSONL",
        )
    return RowSource(path, "json", value, _columns(value))


def _from_arrow(path: str, kind: str, table) -> RowSource:
    from datasets import Dataset

    try:
        table.validate(full=True)  # e.g. invalid UTF-8 in a string column, which pyarrow reads without checking
        dataset = Dataset(table)
    except Exception as err:  # bad data, or column names or types that datasets cannot represent
        raise UserError(
            f"{path}: data that cannot be loaded ({type(err).__name__}: {err})",
            "rewrite the file with valid UTF-8 strings and unique column names",
        ) from None
    return RowSource(path, kind, dataset, list(dataset.column_names))


def read_csv(path: str) -> RowSource:
    import pandas

    _decode(path, Path(path).read_bytes())  # names the line of a bad byte; pandas would not
    try:
        frame = pandas.read_csv(path, dtype=str, keep_default_na=False, encoding="utf-8-sig")
    except Exception as err:  # pandas raises a zoo of parser errors; all mean "this CSV is unreadable"
        raise UserError(
            f"{path}: not a readable CSV file ({err})".strip(), "check the quoting and the header"
        ) from None
    import pyarrow

    try:
        table = pyarrow.Table.from_pandas(frame, preserve_index=False)
    except Exception as err:  # e.g. duplicate or non-string header cells
        raise UserError(f"{path}: header that cannot be loaded ({err})", "give every column a unique name") from None
    return _from_arrow(path, "csv", table)


def read_parquet(path: str) -> RowSource:
    import pyarrow.parquet

    try:
        table = pyarrow.parquet.read_table(path)
    except Exception as err:  # ArrowInvalid, OSError, ...: the file is not a complete Parquet file
        raise UserError(f"{path}: not a readable Parquet file ({err})", "rewrite the file") from None
    return _from_arrow(path, "parquet", table)


def read_saved_dataset(path: str) -> RowSource:
    import datasets

    try:
        loaded = datasets.load_from_disk(path)
    except Exception as err:  # missing/corrupt state.json or arrow files
        raise UserError(
            f"{path}: not a datasets.save_to_disk directory ({type(err).__name__}: {err})",
            "pass the directory written by Dataset.save_to_disk, or the data files themselves",
        ) from None
    if isinstance(loaded, datasets.DatasetDict):
        if "train" not in loaded and len(loaded) != 1:
            raise UserError(
                f"{path}: saved DatasetDict has splits {sorted(loaded)} and none is 'train'", "save one split"
            )
        loaded = loaded["train"] if "train" in loaded else next(iter(loaded.values()))
    return RowSource(path, "dataset-dir", loaded, list(loaded.column_names))


PEEK_BYTES = 1 << 20
"""How much of a file `peek_source` reads: enough for the first rows of any sane file, cheap on a huge one."""
SAVED_MARKS = ("state.json", "dataset_dict.json")  # what Dataset/DatasetDict.save_to_disk write at the top


def _head(path: str) -> tuple[bytes, bool]:
    """The first PEEK_BYTES of `path` cut after its last whole line, and whether that is the whole file."""
    try:
        with open(path, "rb") as file:
            head = file.read(PEEK_BYTES)
            whole = not file.read(1)
    except OSError as err:
        raise UserError(f"{path}: cannot read ({err.strerror or err})", "check the path and permissions") from None
    return (head, True) if whole else (head[: head.rfind(b"\n") + 1], False)


def _peek_text_rows(path: str, kind: str, head: bytes, limit: int, skip_bad: bool) -> RowSource:
    """The first `limit` rows of `head`. Every JSONL line of it is read: the first that is not JSON (or not UTF-8)
    is refused, unless skip_bad passes such lines over (the run skips and counts them)."""
    import csv
    import io

    if kind == "csv":
        reader = csv.DictReader(io.StringIO(_decode(path, head)))
        rows = [dict(row) for _, row in zip(range(limit), reader, strict=False)]
        return RowSource(path, "csv", rows, list(reader.fieldnames or []))
    rows, lines, offset = [], [], 0
    for number, data in enumerate(head.split(b"\n"), 1):
        if skip_bad and len(rows) >= limit:
            break
        row = _jsonl_row(path, data, number, offset) if data.strip() else None
        offset += len(data) + 1
        if isinstance(row, Unparsed):
            if not skip_bad:
                raise row.error(path)
        elif row is not None and len(rows) < limit:
            rows.append(row)
            lines.append(number)
    return RowSource(path, "jsonl", rows, _columns(rows), lines)


def data_files(path: str) -> list[str]:
    """What `path` (--data, --eval-data) reads: itself (a file, a saved `datasets` directory), or a directory's data
    files, each file directly in it whose extension is known (SUFFIXES; hidden files left out), in name order."""
    location = Path(path)
    if not location.is_dir() or any((location / mark).is_file() for mark in SAVED_MARKS):
        return [path]
    names = sorted(p.name for p in location.iterdir() if p.is_file() and p.suffix.lower() in SUFFIXES
                   and not p.name.startswith("."))  # fmt: skip
    if not names:
        raise UserError(
            f"{path}: no data files in it ({', '.join(sorted(SUFFIXES))}), and not a datasets.save_to_disk directory"
            f" (no {' or '.join(SAVED_MARKS)})",
            "put the data files in it, pass the files themselves, or the directory Dataset.save_to_disk wrote",
        )
    return [str(location / name) for name in names]


def peek_source(path: str, limit: int = 16, skip_bad: bool = False) -> tuple[RowSource, bool]:
    """(The first `limit` rows of `path`, whether its columns are known for the whole file), read cheaply: the
    first MiB of JSONL/CSV, a JSON file under a MiB, a Parquet schema, a saved directory's marks. It fails as
    `read_source` would on what it reads, so a wrong --data is said in the first second, not by the ranks; a JSONL
    line that is not JSON too, unless `skip_bad` (the run skips and counts it). `path`: one of `data_files`."""
    location = Path(path)
    if location.is_dir():
        data_files(path)  # a directory of data files is peeked file by file; an empty one is refused here
        return RowSource(path, "dataset-dir", [], []), False
    if not location.exists():
        raise UserError(f"{path}: no such file or directory", f"pass {SUPPORTED}")
    kind = SUFFIXES.get(location.suffix.lower())
    if kind is None:
        raise UserError(f"{path}: unknown file type {location.suffix!r}", f"pass {SUPPORTED} (by extension)")
    head, whole = _head(path)
    if kind == "parquet":
        return _peek_parquet(path), True
    if kind == "json":
        if not whole:  # a big JSON list is only parsed whole; its first bytes are at least readable
            return RowSource(path, "json", [], []), False
        source = read_json(path)
        return RowSource(path, source.kind, source.rows[:limit], source.columns, source.lines), True
    source = _peek_text_rows(path, kind, head, limit, skip_bad)
    all_skipped = skip_bad and kind == "jsonl" and bool(head.strip())  # the run says "no usable rows" with counts
    if whole and not source.rows and not all_skipped:
        raise UserError(f"{path}: holds no rows", "pass a file with at least one example")
    return source, kind == "csv" or (whole and len(source.rows) < limit)


def _peek_parquet(path: str) -> RowSource:
    import pyarrow.parquet

    try:
        schema = pyarrow.parquet.read_schema(path)
    except Exception as err:  # ArrowInvalid, OSError, ...: the file is not a complete Parquet file
        raise UserError(f"{path}: not a readable Parquet file ({err})", "rewrite the file") from None
    return RowSource(path, "parquet", [], list(schema.names))


READERS = {"jsonl": read_jsonl, "json": read_json, "csv": read_csv, "parquet": read_parquet}


def read_source(path: str) -> RowSource:
    """One file or saved directory -> RowSource; every failure is a UserError naming the path."""
    location = Path(path)
    if location.is_dir():
        return read_saved_dataset(path)
    if not location.exists():
        raise UserError(f"{path}: no such file or directory", f"pass {SUPPORTED}")
    kind = SUFFIXES.get(location.suffix.lower())
    if kind is None:
        raise UserError(f"{path}: unknown file type {location.suffix!r}", f"pass {SUPPORTED} (by extension)")
    try:
        source = READERS[kind](path)
    except OSError as err:
        raise UserError(f"{path}: cannot read ({err.strerror or err})", "check the path and permissions") from None
    if not len(source.rows):
        raise UserError(f"{path}: holds no rows", "pass a file with at least one example")
    return source


def count_rows(path: str) -> int | None:
    """Rows in `path` when that is cheap to know (a file of at most PEEK_BYTES, a Parquet file's metadata), else
    None: the input checks say a --val-size that leaves no training rows before any work where they can."""
    location = Path(path)
    kind = SUFFIXES.get(location.suffix.lower())
    if location.is_dir() or kind is None or not location.is_file():
        return None
    if kind == "parquet":
        import pyarrow.parquet

        try:
            return pyarrow.parquet.ParquetFile(path).metadata.num_rows
        except Exception:  # not readable: peek_source says so
            return None
    if location.stat().st_size > PEEK_BYTES:
        return None
    return len(read_source(path).rows)
