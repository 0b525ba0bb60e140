"""Test hook for the dist tests, outside the product: a test that puts this folder on PYTHONPATH and sets
ZERO_KIT_PROBE_LOGITS=FILE gets, in every rank of `zero-kit train` (also behind `--nproc` and the launchers),
a Trainer callback that runs the trained model on a fixed batch of its training data at the end of training;
rank 0 saves the fp32 logits to FILE. Exported weights must reproduce them exactly.

Python imports `sitecustomize` at start-up in every interpreter, so this also reaches the ranks the
`deepspeed` launcher starts; it patches nothing unless the variable is set."""

import os

if os.environ.get("ZERO_KIT_PROBE_LOGITS"):
    from transformers import TrainerCallback

    import zero_kit.train.rank as job

    class ProbeLogits(TrainerCallback):
        def on_train_end(self, args, state, control, model=None, train_dataloader=None, **kwargs):
            import torch

            if state.global_step < state.max_steps:  # preempted: the run is not over
                return
            data = train_dataloader.dataset
            batch = train_dataloader.collate_fn([data[0], data[1]])
            inputs = {k: v.to(args.device) for k, v in batch.items() if k in ("input_ids", "attention_mask")}
            model.eval()
            with torch.no_grad():  # every rank runs it: under ZeRO-3 the forward gathers parameters
                logits = model(**inputs).logits.float().cpu()
            if args.process_index == 0:
                torch.save(
                    {**{k: v.cpu() for k, v in inputs.items()}, "logits": logits}, os.environ["ZERO_KIT_PROBE_LOGITS"]
                )

    _build_trainer = job._trainer

    def _trainer_with_probe(*args, **kwargs):
        built = _build_trainer(*args, **kwargs)  # the Trainer first, then what rank.py keeps beside it
        built[0].add_callback(ProbeLogits())
        return built

    job._trainer = _trainer_with_probe

# ZERO_KIT_PROBE_NO_REPLAN=1: in a rank its starting process launched (the plan is in its environment), every
# function that resolves a run's sizes, stage or plan fails the rank: the ranks must run the plan they were given.
if os.environ.get("ZERO_KIT_PROBE_NO_REPLAN") and os.environ.get("ZERO_KIT_PLAN"):
    import zero_kit.dist as _dist
    import zero_kit.train.plan as _plan

    def _replanned(*args, **kwargs):
        raise AssertionError("a rank resolved its run again instead of running its parent's plan")

    for _name in ("plan_run", "launch_sizes", "zero_stage_of", "world_size_from_env", "this_host"):
        setattr(_plan, _name, _replanned)
    _dist.world_size_from_env = _replanned
