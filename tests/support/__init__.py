"""Shared test support for every tier (unit, dist, multinode, gpu): import it as `tests.support`.

- `tests.support.jobs`: the venv's `zero-kit`, the offline environment, commands that must succeed, jobs started
  in their own session with their output in a log file, killing a job's whole session, waiting for a condition
  (the rigs' one `wait_until`, tests/rigs/base.py, failing with the job's log);
- `tests.support.runs`: what a `zero-kit train` output directory holds: logged steps, the run record, the
  checkpoint pointer, the step a relaunch resumed from, final weights and their bitwise comparison;
- `tests.support.rigs`: the marks of a test module that needs a rig (root, binaries), the namespaces that exist
  (tests/multinode/conftest.py adds the `cpu_ops` fixture: DeepSpeed's CPU ops built outside launcher timeouts);
- `tests.support.ops`: DeepSpeed's CPU ops built once per test run (in the background by scripts/test_tiers.py);
- `tests.support.shared`: reference runs trained once per test run, read by every file that compares with them.

Only what more than one tier or test file needs lives here; a tier's own set-up (the dist reliability job, the
multinode fault job and its hosts) stays beside its tests and is built from these pieces.
"""
