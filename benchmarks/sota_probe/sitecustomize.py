"""Collection time of a TorchRL script, measured from outside it (``benchmarks/sota.py`` puts this folder on the
script's ``PYTHONPATH`` with ``SOTA_PROBE=<file prefix>``): every ``next()`` on a collector's iterator (TorchRL's
``BaseCollector`` and tdcollect's ``CollectorBase``, patched as their modules are imported) is timed, and each
process that iterated one writes ``{"seconds", "frames", "batches"}`` to ``<prefix>.<pid>.json`` at exit. TorchRL's
CSV logger, which the benchmark reads the losses and returns from, is given the mean of a list it is asked to log
(SAC logs every episode return that ended in a batch, a list where several ended; the CSV logger stops at
``float(list)``). The scalars a script logs through TorchRL's wandb logger (the trainer scripts', run with
``WANDB_MODE=disabled``) are kept too, in that file's ``"scalars"`` (``{"name": [values]}``), and so are the CPU
seconds of the process and of its children (``"cpu"``: the collector workers, once joined). Then the
``sitecustomize`` this one hides, if any, runs."""
import atexit
import importlib.abc
import importlib.machinery
import json
import os
import sys
import time

PREFIX = os.environ.get("SOTA_PROBE")
totals = {"seconds": 0.0, "frames": 0, "batches": 0}
scalars: dict[str, list[float]] = {}


def timed(iterate):
    def __iter__(self):
        batches = iterate(self)
        while True:
            start = time.perf_counter()
            try:
                batch = next(batches)
            except StopIteration:
                return
            waited = time.perf_counter() - start
            if not totals["batches"]:
                totals["first_s"] = waited  # (the first batch waits for the workers to start)
            totals["seconds"] += waited
            totals["frames"] += batch.numel()
            totals["batches"] += 1
            yield batch

    return __iter__


def time_iterations(cls):
    cls.__iter__ = timed(cls.__iter__)


def log_list_means(experiment):
    add_scalar = experiment.add_scalar

    def add_mean(self, name, value, global_step=None):
        if isinstance(value, (list, tuple)):
            value = sum(value) / len(value)
        add_scalar(self, name, value, global_step)

    experiment.add_scalar = add_mean


def keep_scalars(logger):
    log_scalar = logger.log_scalar
    log_metrics = logger.log_metrics

    def kept_scalar(self, name, value, *args, **kwargs):
        scalars.setdefault(str(name), []).append(float(value))
        return log_scalar(self, name, value, *args, **kwargs)

    def kept_metrics(self, metrics, *args, **kwargs):
        for name, value in dict(metrics).items():
            try:
                scalars.setdefault(str(name), []).append(float(value))
            except (TypeError, ValueError):  # (not a scalar)
                pass
        return log_metrics(self, metrics, *args, **kwargs)

    logger.log_scalar = kept_scalar
    logger.log_metrics = kept_metrics


#: module -> (class, what is done to it once the module has run)
TARGETS = {"torchrl.collectors._base": ("BaseCollector", time_iterations),
           "tdcollect.collectors.base": ("CollectorBase", time_iterations),
           "torchrl.record.loggers.csv": ("CSVExperiment", log_list_means),
           "torchrl.record.loggers.wandb": ("WandbLogger", keep_scalars)}


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
            cls_name, patch = TARGETS[name]
            patch(getattr(module, cls_name))

        spec.loader.exec_module = exec_module
        return spec


def write():
    if totals["batches"] or scalars:
        times = os.times()  # this process's CPU seconds, and its children's (the workers, once joined)
        cpu = {"self": times.user + times.system, "children": times.children_user + times.children_system}
        with open(f"{PREFIX}.{os.getpid()}.json", "w") as f:
            json.dump({**totals, "scalars": scalars, "cpu": cpu}, f)


if PREFIX:
    sys.meta_path.insert(0, PatchAfterExec())
    atexit.register(write)

if __name__ == "sitecustomize":
    from tdcollect.script import run_hidden_sitecustomize

    run_hidden_sitecustomize(os.path.dirname(os.path.abspath(__file__)))
