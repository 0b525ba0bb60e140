"""Put on PYTHONPATH by benchmarks/gpu/suite.py: DeepSpeed's logger at INFO on every rank, so the run's log says
which optimizer DeepSpeed built ("DeepSpeed Basic Optimizer = FusedAdam" or "Using client Optimizer"). DeepSpeed
sets its logger to WARNING when deepspeed.utils.logging is imported, so the level is raised right after."""

import importlib.abc
import importlib.machinery
import logging
import sys

_TARGET = "deepspeed.utils.logging"


class _RaiseAfterImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != _TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        original = spec.loader.exec_module

        def exec_module(module):
            original(module)
            module.logger.setLevel(logging.INFO)
            for handler in module.logger.handlers:
                handler.setLevel(logging.INFO)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _RaiseAfterImport())
