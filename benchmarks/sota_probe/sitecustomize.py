"""Collection time of a TorchRL script, measured from outside it (``benchmarks/sota.py`` puts this folder on the
script's ``PYTHONPATH`` with ``SOTA_PROBE=<file prefix>``): every ``next()`` on a collector's iterator (TorchRL's
``BaseCollector`` and tdcollect's ``CollectorBase``, patched as their modules are imported) is timed, and each
process that iterated one writes ``{"seconds", "frames", "batches"}`` to ``<prefix>.<pid>.json`` at exit. Then the
``sitecustomize`` this one hides, if any, runs."""
import atexit
import importlib.abc
import importlib.machinery
import json
import os
import sys
import time

PREFIX = os.environ.get("SOTA_PROBE")
#: module -> the collector base class whose ``__iter__`` is timed
TARGETS = {"torchrl.collectors._base": "BaseCollector", "tdcollect.collectors.base": "CollectorBase"}
totals = {"seconds": 0.0, "frames": 0, "batches": 0}


def timed(iterate):
    def __iter__(self):
        batches = iterate(self)
        while True:
            start = time.perf_counter()
            try:
                batch = next(batches)
            except StopIteration:
                return
            totals["seconds"] += time.perf_counter() - start
            totals["frames"] += batch.numel()
            totals["batches"] += 1
            yield batch

    return __iter__


class PatchAfterExec(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in TARGETS:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            cls = getattr(module, TARGETS[name])
            cls.__iter__ = timed(cls.__iter__)

        spec.loader.exec_module = exec_module
        return spec


def write():
    if totals["batches"]:
        with open(f"{PREFIX}.{os.getpid()}.json", "w") as f:
            json.dump(totals, f)


if PREFIX:
    sys.meta_path.insert(0, PatchAfterExec())
    atexit.register(write)

if __name__ == "sitecustomize":
    from tdcollect.script import run_hidden_sitecustomize

    run_hidden_sitecustomize(os.path.dirname(os.path.abspath(__file__)))
