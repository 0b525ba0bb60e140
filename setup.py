"""zero_kit: DeepSpeed ZeRO configs, linting, memory planning, fine-tuning and benchmarks for LLaMA-style models."""

from pathlib import Path

from setuptools import find_packages, setup

# Exact pins for the libraries whose config schemas and behaviour zero_kit depends on; torch is a
# range so GPU users can keep their CUDA build (CPU users pin torch==2.13.0 first, see README).
# docker/Dockerfile pins the same versions; tests/unit/test_packaging.py checks they agree.
PINNED = {
    "deepspeed": "0.19.8",
    "transformers": "5.23.0",
    "datasets": "5.2.0",
    "accelerate": "1.15.0",
    "peft": "0.21.2",
}
TORCH_RANGE = ">=2.6,<2.14"

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
    install_requires=[
        f"torch{TORCH_RANGE}",
        *(f"{name}=={version}" for name, version in PINNED.items()),
        "tokenizers>=0.21",
        "safetensors>=0.4",
        "matplotlib>=3.7",
        "psutil>=5.9",
        "ninja>=1.11",
    ],
    extras_require={"dev": ["pytest>=8", "ruff>=0.6", "hypothesis>=6.100"]},
    entry_points={"console_scripts": ["zero-kit=zero_kit.cli:console"]},
)
