"""pytest plugin: run TorchRL's own tests with tdcollect's classes in place of TorchRL's.

``TDSWAP=ours`` (default) puts tdcollect's ``ParallelEnv`` (``TDSWAP_SUITE=envs``, the default) or its
collectors (``TDSWAP_SUITE=collectors``: ``Collector``, ``MultiSyncCollector``, ``MultiAsyncCollector``,
``AsyncCollector``) under TorchRL's names before the test modules import them; ``TDSWAP=torchrl`` keeps TorchRL's
classes (the reference run). Selection: ``TDSWAP_ONLY_PARALLEL=1`` keeps the tests whose source mentions
``ParallelEnv`` (or builds one through ``_make_envs`` / the ``maybe_fork_ParallelEnv`` fixture);
``TDSWAP_SELECT=<file>`` keeps the node ids listed in that file (one per line, ``#`` comments), less those that
start with a prefix listed in ``TDSWAP_SKIP=<file>`` (same format).
``TDSWAP_RECORD=<file.json>`` writes per test the collector classes it constructed in this process and its
outcome: ``{node id: {"built": [names], "outcome": str}}`` (how the selection was made).
"""
import inspect
import json
import os

COLLECTORS = ("Collector", "MultiSyncCollector", "MultiAsyncCollector", "AsyncCollector")
_built: dict = {}
_outcomes: dict = {}
_current = [None]


def pytest_configure(config):
    import torchrl.collectors
    import torchrl.envs
    import torchrl.envs.batched_envs

    ours = os.environ.get("TDSWAP", "ours") == "ours"
    if os.environ.get("TDSWAP_SUITE", "envs") == "collectors":
        if ours:
            import tdcollect.collectors

            for name in COLLECTORS:
                setattr(torchrl.collectors, name, getattr(tdcollect.collectors, name))
        if os.environ.get("TDSWAP_RECORD"):
            for cls in {getattr(torchrl.collectors, name) for name in COLLECTORS} | {torchrl.collectors.MultiCollector}:
                if "__init__" in vars(cls):
                    _record_constructions(cls)
    elif ours:
        from tdcollect.envs import ParallelEnv

        torchrl.envs.ParallelEnv = ParallelEnv  # what the test modules import, and the fixture's class
        torchrl.envs.batched_envs.ParallelEnv = ParallelEnv


def _record_constructions(cls) -> None:
    init = cls.__init__

    def __init__(self, *args, **kwargs):
        if _current[0] is not None:
            _built.setdefault(_current[0], set()).add(type(self).__name__)
        init(self, *args, **kwargs)

    cls.__init__ = __init__


def _builds_a_parallel_env(item) -> bool:
    try:
        source = inspect.getsource(item.function)
    except (OSError, TypeError):
        source = ""
    return ("ParallelEnv" in source or "_make_envs" in source
            or "maybe_fork_ParallelEnv" in getattr(item, "fixturenames", ()))


def pytest_collection_modifyitems(config, items):
    if os.environ.get("TDSWAP_ONLY_PARALLEL"):
        keep = [item for item in items if _builds_a_parallel_env(item)]
    elif os.environ.get("TDSWAP_SELECT"):
        with open(os.environ["TDSWAP_SELECT"]) as f:
            wanted = {line.split("#")[0].strip() for line in f} - {""}
        skipped: set = set()
        if os.environ.get("TDSWAP_SKIP"):
            with open(os.environ["TDSWAP_SKIP"]) as f:
                skipped = {line.split("#")[0].strip() for line in f} - {""}
        keep = [item for item in items if item.nodeid in wanted  # skip prefixes are relative to test/, as reported
                and not any(item.nodeid.removeprefix("test/").startswith(prefix) for prefix in skipped)]
    else:
        return
    config.hook.pytest_deselected(items=[item for item in items if item not in keep])
    items[:] = keep


def pytest_runtest_setup(item):
    _current[0] = item.nodeid


def pytest_runtest_logreport(report):
    if report.when == "call" or report.outcome != "passed":
        if _outcomes.get(report.nodeid) in (None, "passed"):
            _outcomes[report.nodeid] = report.outcome


def pytest_sessionfinish(session):
    if os.environ.get("TDSWAP_RECORD"):
        with open(os.environ["TDSWAP_RECORD"], "w") as f:
            json.dump({node: {"built": sorted(_built.get(node, ())), "outcome": outcome}
                       for node, outcome in sorted(_outcomes.items())}, f, indent=0)
