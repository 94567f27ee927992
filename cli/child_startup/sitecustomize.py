"""Run at the start of every Python process a script run by ``tdcollect run`` starts (this folder is first on their
``PYTHONPATH``): where ``TDCOLLECT_RUN`` is set, TorchRL's batched envs and collectors are replaced by tdcollect's
once the process imports them (see ``tdcollect/script.py``). Then the ``sitecustomize`` this one hides, if any, runs
as it would have."""
import os

from tdcollect.script import replace_on_import, run_hidden_sitecustomize

if os.environ.get("TDCOLLECT_RUN"):
    replace_on_import(os.environ["TDCOLLECT_RUN"])

if __name__ == "sitecustomize":  # as the process' own (not imported as tdcollect.child_startup.sitecustomize)
    run_hidden_sitecustomize(os.path.dirname(os.path.abspath(__file__)))
