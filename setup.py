"""zero_kit: DeepSpeed ZeRO configs, linting, memory planning, fine-tuning and benchmarks for LLaMA-style models."""

from pathlib import Path

from setuptools import find_packages, setup

# Ranges from the oldest to the newest release set tested in CI (.ci/run): constraints/oldest.txt pins every
# lower bound below, constraints/newest.txt the newest tested releases (also used by docker/Dockerfile), and
# tests/unit/test_packaging.py checks that the two lock files and these ranges agree. Upper bounds stop at the
# next major (minor for DeepSpeed, whose config schema changes between minors) so an untested release is not
# picked up silently. torch is a range so GPU users keep their CUDA build (CPU users pin torch==2.13.0 first).
REQUIRES = {
    "torch": ">=2.6,<2.14",
    # ZeRO-2 with gradient accumulation: wrong gradients before 0.18.3, a crash in step() on 0.18.7-0.18.9
    # (README: Supported versions)
    "deepspeed": ">=0.18.3,!=0.18.7,!=0.18.8,!=0.18.9,<0.20",
    "transformers": ">=4.57.6,<6",
    "accelerate": ">=1.11.0,<2",
    "peft": ">=0.18.0,<1",
    "datasets": ">=4.0.0,<6",
    "tokenizers": ">=0.22",
    "safetensors": ">=0.4",
    "matplotlib": ">=3.7",
    "psutil": ">=5.9",
    "ninja": ">=1.11",
}

TRL = "trl>=0.29.1,<2"  # the range zero_kit.train.preference.TRL_TESTED checks at run time

setup(
    name="zero_kit",
    version="0.1.0",
    description=__doc__,
    long_description=Path(__file__).with_name("README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["zero_kit", "zero_kit.*"]),
    package_data={"zero_kit": ["assets/*", "assets/**/*"]},
    include_package_data=True,
    install_requires=[f"{name}{spec}" for name, spec in REQUIRES.items()],
    # dpo: `zero-kit train --method dpo` runs TRL's DPOTrainer (zero_kit/train/preference.py refuses a run without it,
    # naming this extra). 0.29.1 is the newest TRL whose requirements admit constraints/oldest.txt (1.x needs
    # datasets>=4.7); constraints/oldest.txt and newest.txt pin both ends of the range.
    # tensorboard: `zero-kit train --report-to tensorboard` is tested by reading its event files back.
    # trl in dev too: the DPO tests, and a real third-party client of the generated configs
    # (tests/dist/test_third_party_clients.py runs `trl sft`).
    extras_require={
        "dpo": [TRL],
        "dev": [
            "pytest>=8",
            "pytest-xdist>=3.5",
            "ruff>=0.6",
            "hypothesis>=6.100",
            "tensorboard>=2.14",
            TRL,
        ],
    },
    entry_points={"console_scripts": ["zero-kit=zero_kit.cli:console"]},
)
