"""Test-only fault injection for tests/dist/test_reliability.py, on the PYTHONPATH of a launched job only.

ZK_FAULT_PAUSE=POINT and ZK_FAULT_CKPT=checkpoint-N make the rank that reaches POINT of the save of
checkpoint-N write the file ZK_FAULT_MARKER and then stall (a hung disk); the test SIGKILLs the whole job as
soon as the marker appears. So a kill lands at an exact moment of the save however loaded the machine is:

  created   the Trainer just created the checkpoint directory (os.makedirs), before any file;
  shards    DeepSpeed wrote every rank's shards and copies zero_to_fp32.py (shutil.copyfile), before the
            Trainer's own files (rng states, trainer_state.json);
  sealing   every file is written and fsynced; zero-kit is about to rename the manifest into place (os.replace).
"""

import os

_POINT = os.environ.get("ZK_FAULT_PAUSE", "")
_CKPT = os.environ.get("ZK_FAULT_CKPT", "")
_MARKER = os.environ.get("ZK_FAULT_MARKER", "")

if _POINT and _CKPT and _MARKER:
    import shutil
    import time

    def _stall(point: str, path) -> None:
        if point != _POINT or _CKPT not in str(path).split(os.sep):
            return
        with open(_MARKER, "w") as marker:
            marker.write(f"{point} {path}\n")
        time.sleep(3600)

    _makedirs, _copyfile, _replace = os.makedirs, shutil.copyfile, os.replace

    def makedirs(name, *args, **kwargs):
        _makedirs(name, *args, **kwargs)
        if os.path.basename(os.path.normpath(str(name))) == _CKPT:
            _stall("created", name)

    def copyfile(src, dst, *args, **kwargs):
        _stall("shards", dst)
        return _copyfile(src, dst, *args, **kwargs)

    def replace(src, dst, *args, **kwargs):
        if os.path.basename(str(dst)) == "zero_kit_complete.json":
            _stall("sealing", dst)
        return _replace(src, dst, *args, **kwargs)

    os.makedirs, shutil.copyfile, os.replace = makedirs, copyfile, replace

# ZERO_KIT_FAULT_EXIT_RANK=r and ZERO_KIT_FAULT_EXIT_CODE=c (ZERO_KIT_* reach pdsh ranks too): rank r leaves
# with exit code c once its training is done, before the ranks' final barrier (a rank failing on one node: its peers then lose their connection and fail too).
_EXIT_RANK = os.environ.get("ZERO_KIT_FAULT_EXIT_RANK", "")
# srun-started ranks (zero-kit launch --slurm -- train) have only SLURM_PROCID until zero-kit translates it.
if _EXIT_RANK and os.environ.get("RANK", os.environ.get("SLURM_PROCID")) == _EXIT_RANK:
    import sys

    import zero_kit.train.rank as _job

    _train = _job._train

    def _train_then_exit(*args, **kwargs):
        _train(*args, **kwargs)
        print(f"[fault] rank {_EXIT_RANK} exits {os.environ['ZERO_KIT_FAULT_EXIT_CODE']}", flush=True)
        sys.exit(int(os.environ["ZERO_KIT_FAULT_EXIT_CODE"]))

    _job._train = _train_then_exit
