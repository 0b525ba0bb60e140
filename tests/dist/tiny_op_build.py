"""A tiny DeepSpeed op, JIT-built the way DeepSpeed builds its CPU ops (OpBuilder.jit_load -> torch's
cpp_extension.load: the FileBaton `lock`, ninja, the compiler), in seconds instead of minutes.

    python tests/dist/tiny_op_build.py SOURCE [--guard]    # prints "tiny op says 42" once loaded

--guard: through zero_kit.launch.ops.guard_op_builds, as `zero-kit train` and `bench` ranks load ops."""

from __future__ import annotations

import sys

from deepspeed.ops.op_builder.builder import OpBuilder

SOURCE = """#include <pybind11/pybind11.h>
int answer() { return 42; }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("answer", &answer); }
"""


class TinyBuilder(OpBuilder):
    BUILD_VAR = "DS_BUILD_ZK_TINY"
    NAME = "zk_tiny"

    def __init__(self, source: str) -> None:
        super().__init__(name=self.NAME)
        self.source = source

    def absolute_name(self) -> str:
        return "zk_tiny_op"

    def sources(self) -> list[str]:
        return [self.source]

    def include_paths(self) -> list[str]:
        return []

    def cxx_args(self) -> list[str]:
        return ["-O0"]

    def extra_ldflags(self) -> list[str]:
        return []


if __name__ == "__main__":
    if "--guard" in sys.argv:
        from zero_kit.launch.ops import guard_op_builds

        guard_op_builds()
    module = TinyBuilder(sys.argv[1]).load(verbose=False)
    print(f"tiny op says {module.answer()}", flush=True)
