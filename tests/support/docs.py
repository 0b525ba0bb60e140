"""The code blocks of README.md and docs/*.md, each with the marker that says how CI checks it.

The line just above a fenced block is an HTML comment (invisible on GitHub) naming what the block is:

- `<!-- doc: run -->`: commands that run on CPU within seconds; tests/unit/test_docs.py runs each line as written
  (bash, in a folder of its own per doc file, blocks in document order) and expects exit 0, or N where the line's
  comment says `(exit N)`; a figure the comment quotes (`62.7 GiB`) must be printed. Lines starting with `$ ` are
  commands whose expected output follows them. A python block is run as a script. `run K REASON` runs the first K
  commands; the others are parsed (below) and REASON says why they are not run here.
- `<!-- doc: output -->` / `<!-- doc: shape -->`: what the last command of the `run` block above prints; every
  line shown must appear in that order (`shape`: with any number in place of each number shown, for figures of
  the machine such as tokens/s).
- `<!-- doc: parse REASON -->`: launches (training, benchmarks, a cluster's jobs): every zero-kit command, also one
  under a launcher (`-m zero_kit.cli`), is parsed by zero-kit's own parser (flags and values); REASON says why it
  is not run here and where its kind of run is tested.
- `<!-- doc: covered ID TEST -->`: a launch (training, a benchmark), or a launch's sample, that TEST runs or checks:
  a test file that reads this block through `command(ID)` or `covered(ID)`. It runs a command as written, its
  placeholders made files, and says what it adds (a port, an output, the run's length); so each launch is paid
  once, by the test that checks its results.
- `<!-- doc: excerpt FILE -->`: lines from FILE, a script that runs in CI; every line shown is a line of FILE.
- `<!-- doc: file NAME -->`: a file's contents; written to NAME in the folder for the commands after it.
- `<!-- doc: skip REASON -->`: cannot run on a CPU machine without network (GPU ranks, a real cluster's paths,
  Docker, a download); REASON says which.
- `<!-- doc: text -->`: not a command or a file (a layout, a table).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KINDS = ("run", "output", "shape", "parse", "covered", "excerpt", "file", "skip", "text")
MARKER = re.compile(r"^<!-- doc: (\w+)(?: (.*?))? -->$")
EXIT = re.compile(r"\(exit (\d+)\)")
FIGURE = re.compile(r"\d+(?:\.\d+)? GiB")


class DocError(AssertionError):
    """A block without a marker, or a marker that does not parse; its message names the file and line."""


@dataclass(frozen=True)
class Block:
    path: Path  # relative to the repository
    line: int  # of the opening fence
    lang: str
    text: str
    kind: str
    arg: str

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


def doc_files() -> list[Path]:
    return [Path("README.md"), *sorted(p.relative_to(ROOT) for p in (ROOT / "docs").glob("*.md"))]


def blocks(path: Path) -> list[Block]:
    """Every fenced block of one doc file, in order, with its marker."""
    lines = (ROOT / path).read_text(encoding="utf-8").splitlines()
    found, i = [], 0
    while i < len(lines):
        if not lines[i].startswith("```"):
            i += 1
            continue
        start, lang = i, lines[i][3:].strip()
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), None)
        if end is None:
            raise DocError(f"{path}:{start + 1}: a code block that never closes")
        marker = MARKER.match(lines[start - 1].strip()) if start else None
        if marker is None or marker.group(1) not in KINDS:
            raise DocError(
                f"{path}:{start + 1}: no `<!-- doc: KIND -->` line above the block (KIND: {', '.join(KINDS)})"
            )
        text = "\n".join(lines[start + 1 : end]) + "\n"
        found.append(Block(path, start + 1, lang, text, marker.group(1), (marker.group(2) or "").strip()))
        i = end + 1
    return found


def all_blocks() -> list[Block]:
    return [block for path in doc_files() for block in blocks(path)]


def commands(text: str) -> list[tuple[str, str]]:
    """(command, expected output) pairs of a block: its lines with `\\` continuations joined; a `$ ` line's output
    is the lines after it, up to the next `$ ` line."""
    joined, pending = [], ""
    for line in text.splitlines():
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1].rstrip() + " "
            continue
        joined.append(pending + line.strip() if pending else line)
        pending = ""
    sessions = any(line.startswith("$ ") for line in joined)
    pairs: list[tuple[str, str]] = []
    for line in joined:
        if sessions and not line.startswith("$ "):
            if pairs:
                pairs[-1] = (pairs[-1][0], pairs[-1][1] + line + "\n")
            continue
        stripped = line[2:] if sessions else line
        if stripped.strip() and not stripped.lstrip().startswith("#"):
            pairs.append((stripped.strip(), ""))
    return pairs


def _comment(command: str) -> str:
    return command.split(" #", 1)[1] if " #" in command else ""


def expected_exit(command: str) -> int:
    found = EXIT.search(_comment(command))
    return int(found.group(1)) if found else 0


def quoted_figures(command: str) -> list[str]:
    """The sizes a command's comment says it prints (`# zero3: 62.7 GiB`)."""
    return FIGURE.findall(_comment(command))


def runs_first(block: Block) -> int | None:
    """How many commands of a `run` block run (None: all)."""
    first = block.arg.split(maxsplit=1)[0] if block.arg else ""
    return int(first) if first.isdigit() else None


def covered(block_id: str) -> Block:
    """The block marked `covered BLOCK_ID ...`."""
    matches = [b for b in all_blocks() if b.kind == "covered" and b.arg.split()[0] == block_id]
    if len(matches) != 1:
        raise DocError(f"{len(matches)} blocks are marked `covered {block_id}`")
    return matches[0]


def command(block_id: str, index: int = 0) -> list[str]:
    """The argv of the INDEX-th command of a covered block, as the doc writes it (comments dropped)."""
    line = commands(covered(block_id).text)[index][0]
    return shlex.split(line, comments=True)


FIGURE_OR_BAR = re.compile(r"(-?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?|\[[#.]+\])")


def numbers_free(line: str) -> re.Pattern[str]:
    """A pattern matching LINE with any number where LINE has one, and any progress bar where it has one (figures of
    the machine and of the moment); runs of spaces match any run of spaces."""
    parts = FIGURE_OR_BAR.split(" ".join(line.split()))
    pattern = "".join(
        (r"\[[#.]+\]" if part.startswith("[") else r"-?[\d.,]+(?:e[-+]?\d+)?") if k % 2 else re.escape(part)
        for k, part in enumerate(parts)
    )
    return re.compile(pattern)


def missing_lines(expected: str, actual: str, shape: bool = False) -> list[str]:
    """The lines of EXPECTED not found in ACTUAL's lines in the same order (blank lines and `...` ignored)."""
    got = [line.rstrip() for line in actual.splitlines()]
    missing, at = [], 0
    for line in (raw.rstrip() for raw in expected.splitlines()):
        if not line.strip() or line.strip() == "...":
            continue
        if shape:
            pattern = numbers_free(line)
            hit = next((k for k in range(at, len(got)) if pattern.fullmatch(" ".join(got[k].split()))), None)
        else:
            hit = next((k for k in range(at, len(got)) if got[k] == line), None)
        if hit is None:
            missing.append(line)
        else:
            at = hit + 1
    return missing
