"""Test hook for tests/dist/test_own_script_readme.py, outside the product: with ZERO_KIT_PROBE_HELD=DIR set, every
rank of a user's own script named train.py records, when its Trainer is built (after from_pretrained, before
DeepSpeed wraps the model), how many parameter elements it stores and how many the model has, in DIR/rank{R}.json.
Under ZeRO-3's zero.Init each rank stores about 1/world of them; a model built whole stores all of them.

Python imports `sitecustomize` at start-up in every interpreter, so this reaches the ranks the `deepspeed`
launcher starts; it patches nothing unless the variable is set and the script is train.py (not the launcher)."""

import os
import sys

if os.environ.get("ZERO_KIT_PROBE_HELD") and os.path.basename(sys.argv[0]) == "train.py":
    import json

    import transformers

    build_trainer = transformers.Trainer.__init__

    def recording_init(self, *args, model=None, **kwargs):
        params = list(model.parameters())
        record = {
            "stored": sum(p.ds_tensor.numel() if hasattr(p, "ds_tensor") else p.numel() for p in params),
            "total": sum(getattr(p, "ds_numel", p.numel()) for p in params),
        }
        path = os.path.join(os.environ["ZERO_KIT_PROBE_HELD"], f"rank{os.environ['RANK']}.json")
        with open(path, "w") as out:
            json.dump(record, out)
        build_trainer(self, *args, model=model, **kwargs)

    transformers.Trainer.__init__ = recording_init
