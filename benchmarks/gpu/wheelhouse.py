"""Build, on a machine with PyPI, the wheels the GPU image lacks so zero_kit installs there with no network:

    python -m benchmarks.gpu.wheelhouse --out .whl --python-version 3.12

then on the GPU machine without network, with the working tree and `.whl/` copied over:

    pip install --no-index --find-links .whl zero_kit

How the closure is found: B - A, by name and version, for the GPU machine's Python and platform (`pip install
--dry-run --report --only-binary=:all: --python-version --platform`). A is what the image has: `image.txt`
resolved with its dependencies (torch and bare names are metadata-only stub wheels: torch's CUDA closure is not
resolvable here, a bare name's version is unknown). B is the project resolved against PyPI + stubs of the
image's packages; an image package outside the project's range gets no stub, so the constrained one and
its dependencies come from PyPI. What B has and A lacks is downloaded (`pip download --no-deps`, same tags).
A dependency A resolved to today's version is assumed present: if the image is older, put its `pip freeze`
in --image (any NAME==VERSION lines). DeepSpeed has only an sdist; it builds into a
pure-Python wheel (`pip wheel --no-deps deepspeed==X`). The project itself is `pip wheel --no-deps .`.
Versions come from the project's pins (setup.py: ranges) plus `--constraints FILE` (default:
constraints/newest.txt, the newest release set CI tests, so the GPU runs what CI ran). Refuses (exit 2) when the wheelhouse exceeds what a copy to that machine may carry.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_IMAGE = Path(__file__).with_name("image.txt")
CARRY_LIMIT_MIB = 64  # at most 64 MiB of ignored paths travel with the working tree to the GPU machine
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux2014_x86_64")
UNKNOWN_VERSION = "9999"  # a bare name in image.txt: "installed, assumed to satisfy any lower bound"
STUB_LOCAL = "zkimage"  # local version label of the stubs: no real distribution on an index has it
STUBBED = {"torch", "triton"}  # stubs even with a version: their CUDA closure does not resolve off the image


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_image(path: Path) -> tuple[dict[str, str | None], set[str]]:
    """image.txt -> ({canonical name: exact version or None}, names known to be absent: `!name` lines)."""
    image: dict[str, str | None] = {}
    absent: set[str] = set()
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("!"):
            absent.add(canonical(line[1:].strip()))
            continue
        name, _, version = line.partition("==")
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name.strip()):
            raise SystemExit(f"{path}: {raw!r} is not NAME, NAME==VERSION or !NAME")
        image[canonical(name.strip())] = version.strip() or None
    return image, absent


def exact_pins(lines: list[str]) -> dict[str, str]:
    """{canonical name: version} of every `name==version` requirement (markers and extras ignored)."""
    pins = {}
    for line in lines:
        match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?\s*==\s*([^\s;,]+)\s*(?:;.*)?$", line)
        if match:
            pins[canonical(match.group(1))] = match.group(2)
    return pins


def wheel_requires(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        text = zf.read(meta).decode("utf-8")
    return [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Requires-Dist:")]


def write_stub(folder: Path, name: str, version: str) -> Path:
    """A wheel with only metadata: pip sees `name` installed at `version`, with no dependencies."""
    dist = f"{name.replace('-', '_')}-{version}"
    path = folder / f"{dist}-py3-none-any.whl"
    files = {
        f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: zero_kit-stub\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{dist}.dist-info/RECORD"] = "".join(f"{n},,\n" for n in [*files, f"{dist}.dist-info/RECORD"])
    with zipfile.ZipFile(path, "w") as zf:
        for member, text in files.items():
            zf.writestr(member, text)
    return path


def pip(*args: str, quiet: bool = True) -> None:
    cmd = [sys.executable, "-m", "pip", *args, *(["--quiet"] if quiet else [])]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"failed ({done.returncode}): {' '.join(cmd)}\n{done.stdout[-3000:]}{done.stderr[-3000:]}")


def target_flags(python_version: str, platforms: list[str]) -> list[str]:
    flags = ["--only-binary=:all:", "--python-version", python_version, "--implementation", "cp"]
    for platform in platforms:
        flags += ["--platform", platform]
    return flags


def resolve(out: Path, stubs: Path, requirements: list[str], constraints: Path | None, flags: list[str]) -> list:
    """pip's resolution for the target: [(canonical name, version, is_stub)]."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp, "report.json")
        args = ["install", "--dry-run", "--ignore-installed", "--target", str(Path(tmp, "t")), "--report", str(report),
                "--find-links", str(out), "--find-links", str(stubs), *flags, *requirements]  # fmt: skip
        if constraints:
            args += ["--constraint", str(constraints)]
        pip(*args)
        installs = json.loads(report.read_text(encoding="utf-8"))["install"]
    return [
        (canonical(i["metadata"]["name"]), i["metadata"]["version"], f"+{STUB_LOCAL}" in i["metadata"]["version"])
        for i in installs
    ]


def project_ranges(project: Path) -> dict[str, SpecifierSet]:
    """{canonical name: version range} of the project's own (non-extra) requirements, from its wheel."""
    ranges = {}
    for line in wheel_requires(project):
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            ranges[canonical(req.name)] = req.specifier
    return ranges


def image_stubs(
    image: dict[str, str | None], ranges: dict[str, SpecifierSet], stubs: Path, for_project: bool
) -> list[str]:
    """Stub wheels for the image's packages and the requirements that select them. For the image alone (A),
    only what cannot be resolved here is stubbed (torch: its CUDA closure; bare names: unknown version), the
    rest resolves with its real dependencies. For the project (B), the image's version of a package the project
    requires is kept when it is inside the project's range (setup.py), as `pip install` there would keep it;
    one outside it, or a bare name where the range has an upper bound (its version is unknown), is left out: the
    constrained one is shipped."""
    requirements = []
    for name, version in image.items():
        if for_project and name in ranges and not ranges[name].contains(version or UNKNOWN_VERSION):
            print(f"image has {name}=={version or '? (bare name: may be above)'}, the project needs "
                  f"{ranges[name]}: shipping the constrained version")  # fmt: skip
            continue
        if not for_project and version is not None and name not in STUBBED:
            requirements.append(f"{name}=={version}")
            continue
        stub_version = f"{version or UNKNOWN_VERSION}+{STUB_LOCAL}"
        write_stub(stubs, name, stub_version)
        requirements.append(f"{name}=={stub_version}")
    return requirements


def kept_constraints(constraints: Path | None, stubbed: list[str], folder: Path) -> Path | None:
    """The constraints file without the packages the image keeps (their stub is the version pip must take)."""
    if constraints is None:
        return None
    kept = {canonical(r.split("==")[0]) for r in stubbed}
    lines = [line for line in constraints.read_text(encoding="utf-8").splitlines()
             if canonical(re.split(r"[=<>!~ ;\[]", line.strip(), maxsplit=1)[0] or "#") not in kept]  # fmt: skip
    path = folder / "constraints.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def project_wheels(out: Path, constraints: Path | None, sdist_only: list[str]) -> tuple[Path, dict[str, str]]:
    """The project's wheel, wheels built here for pinned sdist-only packages, and the exact pins (the project's
    own exact requirements, then the constraints file's)."""
    pip("wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", str(out), str(ROOT))
    project = max(out.glob("zero_kit-*.whl"), key=lambda p: p.stat().st_mtime)
    pins = exact_pins(wheel_requires(project))
    if constraints:
        pins.update(exact_pins(constraints.read_text(encoding="utf-8").splitlines()))
    for name in sdist_only:  # no binary wheel on PyPI: build a (pure-Python) wheel here
        if name in pins:
            pip("wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", str(out), f"{name}=={pins[name]}")
    return project, pins


def wheel_key(path: Path) -> str:
    name, version = path.name.split("-")[:2]
    return f"{canonical(name)}=={version}"


def build(args: argparse.Namespace) -> list[Path]:
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    constraints = Path(args.constraints).resolve() if args.constraints else None
    project, pins = project_wheels(out, constraints, args.sdist_only)
    image, absent = read_image(Path(args.image))
    flags = target_flags(args.python_version, args.platform)
    with tempfile.TemporaryDirectory() as tmp_a, tempfile.TemporaryDirectory() as tmp_b:
        in_image = resolve(out, Path(tmp_a), image_stubs(image, {}, Path(tmp_a), False), None, flags)
        stubbed = image_stubs(image, project_ranges(project), Path(tmp_b), True)
        requirements = [f"zero_kit @ {project.as_uri()}", *stubbed]
        resolved = resolve(out, Path(tmp_b), requirements, kept_constraints(constraints, stubbed, Path(tmp_b)), flags)
    have_in_image = {(n, v) for n, v, _ in in_image if n not in absent}
    assumed = sorted(f"{n}=={v.split('+')[0]}" for n, v in have_in_image)  # what pip install there relies on
    (out / "image-assumed.txt").write_text("\n".join(assumed) + "\n", encoding="utf-8")
    wanted = [(n, v) for n, v, stub in resolved if not stub and n != "zero-kit" and (n, v) not in have_in_image]
    have = {wheel_key(p) for p in out.glob("*.whl")}
    missing = [f"{name}=={version}" for name, version in wanted if f"{name}=={version}" not in have]
    if missing:  # one pip for all (a pip per wheel took ~1.5 s each, ~30 of them: its start-up and index reads)
        pip("download", "--no-deps", "--dest", str(out), *flags, *missing)
    keep = {f"{n}=={v}" for n, v in wanted} | {wheel_key(project)}
    for stale in out.glob("*.whl"):  # older builds of the project, wheels of a previous resolution
        if wheel_key(stale) not in keep:
            stale.unlink()
    return sorted(out.glob("*.whl"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / ".whl"), help="wheelhouse folder (default: .whl, git-ignored)")
    parser.add_argument("--python-version", default="3.12", help="the GPU machine's Python, e.g. 3.12")
    parser.add_argument("--platform", action="append", help=f"wheel platform tags (default: {', '.join(PLATFORMS)})")
    parser.add_argument("--image", default=str(DEFAULT_IMAGE), help="what the image has (default: image.txt here)")
    default_constraints = ROOT / "constraints" / "newest.txt"
    parser.add_argument("--constraints", default=str(default_constraints),
                        help="exact pins, passed to pip as -c (default: constraints/newest.txt)")  # fmt: skip
    parser.add_argument("--sdist-only", nargs="*", default=["deepspeed"], help="pinned packages built here as wheels")
    parser.add_argument("--max-mib", type=float, default=CARRY_LIMIT_MIB, help="refuse a bigger wheelhouse")
    args = parser.parse_args(argv)
    args.platform = args.platform or list(PLATFORMS)
    wheels = build(args)
    total = sum(w.stat().st_size for w in wheels)
    for wheel in wheels:
        print(f"{wheel.stat().st_size / 2**20:8.2f} MiB  {wheel.name}")
    print(f"{len(wheels)} wheels, {total / 2**20:.1f} MiB in {args.out}")
    if total > args.max_mib * 2**20:
        print(f"error: the wheelhouse is {total / 2**20:.1f} MiB, over the {args.max_mib:g} MiB a copy to "
              f"the GPU machine carries; add what the image already has to {args.image}", file=sys.stderr)  # fmt: skip
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
