"""pytest plugin: run gymnasium's own vector tests with tdcollect's ``ParallelVectorEnv`` as ``AsyncVectorEnv``.

Loaded with ``-p swap_plugin`` from gymnasium's test folder (``../shared/gymnasium-tests``). ``GYMSWAP=ours``
(default) puts ``tdcollect.envs.vector.ParallelVectorEnv`` under the name ``gymnasium.vector.AsyncVectorEnv``
before the test modules import it; ``GYMSWAP=gymnasium`` keeps gymnasium's class (the reference run).
``GYMSWAP_RECORD=<file>`` writes, per test, its outcome and whether it constructed the class under that name in
this process, to ``<file>.<xdist worker>``: ``{node id: [outcome, built]}`` (outcome ``"passed"``, ``"failed"``,
``"skipped"``; the tests that built one are those the gate counts).
``GYMSWAP_SKIP=<file>`` deselects the node ids starting with a listed prefix (``<prefix>  # reason`` per line).
"""
import json
import os

_built: set = set()
_outcomes: dict = {}
_current = [None]


def pytest_configure(config):
    import gymnasium.vector
    import gymnasium.vector.async_vector_env

    if os.environ.get("GYMSWAP", "ours") == "ours":
        from tdcollect.envs.vector import ParallelVectorEnv

        gymnasium.vector.AsyncVectorEnv = ParallelVectorEnv
        gymnasium.vector.async_vector_env.AsyncVectorEnv = ParallelVectorEnv
    cls = gymnasium.vector.AsyncVectorEnv
    init = cls.__init__

    def __init__(self, *args, **kwargs):
        if _current[0] is not None:
            _built.add(_current[0])
        init(self, *args, **kwargs)

    cls.__init__ = __init__


def pytest_collection_modifyitems(config, items):
    if not os.environ.get("GYMSWAP_SKIP"):
        return
    with open(os.environ["GYMSWAP_SKIP"]) as f:
        skipped = {line.split("#")[0].strip() for line in f} - {""}
    keep = [item for item in items if not any(item.nodeid.startswith(prefix) for prefix in skipped)]
    config.hook.pytest_deselected(items=[item for item in items if item not in keep])
    items[:] = keep


def pytest_runtest_setup(item):
    _current[0] = item.nodeid


def pytest_runtest_logreport(report):
    if report.when == "call" or report.outcome != "passed":  # a setup or teardown that failed or skipped counts
        _outcomes.setdefault(report.nodeid, report.outcome)


def pytest_runtest_teardown(item):
    _current[0] = None


def pytest_sessionfinish(session):
    path = os.environ.get("GYMSWAP_RECORD")
    if path:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        with open(f"{path}.{worker}", "w") as f:
            json.dump({test: [outcome, test in _built] for test, outcome in _outcomes.items()}, f, indent=0)
