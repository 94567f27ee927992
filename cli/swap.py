"""TorchRL's batched envs and collectors replaced by tdcollect's under their own names, for ``tdcollect run``.

What is replaced, in each module a script can import it from (:data:`PUBLIC_MODULES`): ``ParallelEnv`` and
``SerialEnv`` (``torchrl.envs``, ``torchrl.envs.batched_envs``), ``Collector``, ``MultiSyncCollector``,
``MultiAsyncCollector`` and ``AsyncCollector`` (``torchrl.collectors``, ``torchrl.collectors.collectors``).
TorchRL's private modules (``torchrl.collectors._single``, its distributed collectors, its env libraries) keep
TorchRL's classes: they are TorchRL's own machinery, not what a script names.

Each name gets a subclass of tdcollect's class (named and placed as TorchRL's, so it pickles by reference in every
process) whose construction falls back on TorchRL's class where tdcollect's would refuse the call
(:func:`refusal` before, :data:`REFUSED` raised by the construction): the object is then TorchRL's, and one line on
stderr says why. ``isinstance(obj, torchrl.envs.ParallelEnv)`` holds for both, so TorchRL's own checks keep
working on an object kept as TorchRL's.

The layout (``layout="machine"``): a ``ParallelEnv(n, make_env)`` asked for more workers than this process has
cores becomes ``w`` workers of ``n // w`` envs each (``w`` the largest divisor of ``n`` up to the cores): the same
batch of ``n`` envs, seeded one after the other as TorchRL seeds them (the same data), in fewer processes.
Constructors or kwargs that differ per env keep the layout asked for (one per worker is all ``envs_per_worker``
takes).
"""
from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Sequence

_ENVS = {name: ("tdcollect.envs", name) for name in ("ParallelEnv", "SerialEnv")}
_COLLECTORS = {name: ("tdcollect.collectors", name) for name in
               ("Collector", "MultiSyncCollector", "MultiAsyncCollector", "AsyncCollector")}
#: {TorchRL module a script imports from: {name: (tdcollect module, name)}}
PUBLIC_MODULES = {"torchrl.envs": _ENVS, "torchrl.envs.batched_envs": _ENVS,
                  "torchrl.collectors": _COLLECTORS, "torchrl.collectors.collectors": _COLLECTORS}
#: layouts: ``"machine"`` (fewer workers, several envs each, where more workers than cores are asked for) or
#: ``"asked"`` (the script's own)
LAYOUTS = ("machine", "asked")
#: what a tdcollect class raises at construction for a call it refuses (bad or unsupported arguments)
REFUSED = (TypeError, ValueError, NotImplementedError)

_said: set[str] = set()  # the stderr lines said already (each once per process)
_done: set[str] = set()  # the modules of PUBLIC_MODULES install() has done
_made: dict[type, type] = {}  # TorchRL's class -> its swapped class (one per class, whatever module holds it)


def say(line: str) -> None:
    """One line on stderr, once per process."""
    if line not in _said:
        _said.add(line)
        print(f"tdcollect run: {line}", file=sys.stderr, flush=True)


def refusal(name: str, bound: inspect.BoundArguments) -> str | None:
    """Why tdcollect's ``name`` would refuse these arguments (TorchRL's signature, bound), before trying it; None
    when nothing is known against them."""
    arguments = bound.arguments
    options = {**arguments, **arguments.get("kwargs", {})}
    if name in ("ParallelEnv", "SerialEnv"):
        if options.get("use_buffers") is False:
            return ("use_buffers=False (envs whose specs change shape): tdcollect's buffers are allocated once, with "
                    "fixed shapes")
        if "mps" in str(options.get("device", "")):
            return "an MPS device: tdcollect's buffers are CPU shared memory"
    return None


def machine_layout(num_workers: int, create_env_fn, create_env_kwargs, cores: int) -> tuple[int, int] | str:
    """``(workers, envs per worker)`` for a ``ParallelEnv(num_workers, ...)`` on ``cores`` cores, or why the
    layout asked for is kept."""
    if not isinstance(num_workers, int) or isinstance(num_workers, bool) or num_workers <= cores:
        return num_workers, 1
    if isinstance(create_env_fn, Sequence) and not _all_same(create_env_fn):
        return "a constructor per env"
    if isinstance(create_env_kwargs, Sequence) and not _all_equal(create_env_kwargs):
        return "create_env_kwargs per env"
    workers = max(w for w in range(1, cores + 1) if num_workers % w == 0)
    return workers, num_workers // workers


def _all_same(items: Sequence) -> bool:
    return all(item is items[0] for item in items)


def _all_equal(items: Sequence) -> bool:
    try:
        return all(item == items[0] for item in items)
    except Exception:  # noqa: BLE001 - values that cannot be compared are taken as different
        return False


def _laid_out(bound: inspect.BoundArguments, layout: str, cores: int) -> tuple[tuple, dict]:
    """``(args, kwargs)`` for tdcollect's ``ParallelEnv`` under ``layout``."""
    args, kwargs = list(bound.args), dict(bound.kwargs)
    arguments = bound.arguments
    if layout != "machine" or "envs_per_worker" in arguments.get("kwargs", {}):
        return tuple(args), kwargs
    num_workers = arguments.get("num_workers")
    fn, fn_kwargs = arguments.get("create_env_fn"), arguments.get("create_env_kwargs")
    chosen = machine_layout(num_workers, fn, fn_kwargs, cores)
    if isinstance(chosen, str):
        say(f"ParallelEnv({num_workers}, ...) kept as {num_workers} workers: {chosen}")
        return tuple(args), kwargs
    workers, per_worker = chosen
    if per_worker == 1:
        return tuple(args), kwargs
    say(f"ParallelEnv({num_workers}, ...) laid out as {workers} workers x {per_worker} envs ({cores} cores; "
        "--layout asked keeps the script's)")
    named = dict(arguments)
    extra = named.pop("kwargs", {})
    named.pop("self", None)
    named["num_workers"] = workers
    if isinstance(fn, Sequence):
        named["create_env_fn"] = fn[0]
    if isinstance(fn_kwargs, Sequence):
        named["create_env_kwargs"] = fn_kwargs[0]
    # (this process' torch threads: lowered by the script's count of workers, as TorchRL's ParallelEnv lowers them)
    return (), {**named, **extra, "envs_per_worker": per_worker, "counted_workers": num_workers}


def swapped_class(name: str, ours: type, theirs: type, layout: str, cores: int) -> type:
    """A subclass of ``ours`` named and placed as ``theirs``, built as ``ours`` unless it refuses the call."""
    signature = inspect.signature(theirs.__init__)

    class Swap(type(ours)):
        def __call__(cls, *args, **kwargs):
            try:
                bound = signature.bind(None, *args, **kwargs)
            except TypeError:  # TorchRL's class raises its own error for a call it does not take either
                return theirs(*args, **kwargs)
            why = refusal(name, bound)
            if why is None:
                if name == "ParallelEnv":
                    args, kwargs = _laid_out(_without_self(bound), layout, cores)
                try:
                    return super().__call__(*args, **kwargs)
                except REFUSED as err:
                    why = str(err).splitlines()[0] if str(err) else type(err).__name__
            say(f"kept TorchRL's {name} for this call: {why}")
            return theirs(*args, **kwargs)

        def __instancecheck__(cls, obj) -> bool:
            return type.__instancecheck__(cls, obj) or isinstance(obj, theirs)

        def __subclasscheck__(cls, sub) -> bool:
            return type.__subclasscheck__(cls, sub) or issubclass(sub, theirs)

    swapped = Swap(name, (ours,), {"__module__": theirs.__module__, "__qualname__": theirs.__qualname__,
                                   "__doc__": ours.__doc__})
    swapped.torchrl_class = theirs
    return swapped


def _without_self(bound: inspect.BoundArguments) -> inspect.BoundArguments:
    """``bound`` (bound with a placeholder ``self``) without it."""
    bound.arguments.pop("self", None)
    return bound


#: what each module of :data:`PUBLIC_MODULES` needs to have run before its names can be replaced (tdcollect's
#: classes import them): TorchRL's envs for every module, its collectors for the collector modules too
NEEDS = {name: ("torchrl.envs", name) if name.startswith("torchrl.envs.") or name == "torchrl.envs"
         else ("torchrl.envs", "torchrl.collectors", name) for name in PUBLIC_MODULES}


def install(layout: str = "machine", cores: int | None = None, ran: frozenset[str] | set[str] | None = None
            ) -> list[str]:
    """Put tdcollect's classes in :data:`PUBLIC_MODULES`: all of them (importing them), or, with ``ran`` (the
    modules whose bodies have run: see ``script.py``), those whose :data:`NEEDS` have run or are imported and done
    initializing. Then :func:`sweep`. Returns what was replaced (``"module.name"``); a module done already is left
    as it is."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    todo = [name for name in pending() if ran is None or (
        all(need in ran or _ready(need) for need in NEEDS[name]) and not _ours_initializing(name, ran))]
    if not todo:
        return []
    from tdcollect.envs.engine.platform_policy import usable_cores

    cores = cores or usable_cores()
    replaced = []
    for module_name in todo:
        names = PUBLIC_MODULES[module_name]
        module = importlib.import_module(module_name)
        for name, (our_module, our_name) in names.items():
            theirs = getattr(module, name, None)
            if theirs is None:
                continue
            if theirs not in _made:
                ours = getattr(importlib.import_module(our_module), our_name)
                _made[theirs] = swapped_class(name, ours, theirs, layout, cores)
            setattr(module, name, _made[theirs])
            replaced.append(f"{module_name}.{name}")
        _done.add(module_name)
    return replaced + sweep()


def sweep() -> list[str]:
    """Replace TorchRL's classes bound in modules outside TorchRL (a script's helper module that imported them
    before :func:`install` ran); returns those places (``"module.name"``). TorchRL's own modules keep what they
    bound: their machinery, not what a script names."""
    replaced = []
    for module_name, module, attribute, theirs in _bindings_outside_torchrl():
        setattr(module, attribute, _made[theirs])
        replaced.append(f"{module_name}.{attribute}")
    return replaced


def kept_places() -> list[str]:
    """Where a module outside TorchRL still holds one of TorchRL's replaced classes, and why (a module imported
    after :func:`install` gets one only from TorchRL's private modules, which keep TorchRL's classes)."""
    return [f"TorchRL's {theirs.__name__} stayed at {module_name}.{attribute}: it was imported from TorchRL's private "
            f"module {theirs.__module__} (import it from {_public_module_of(theirs)} to get tdcollect's)"
            for module_name, _, attribute, theirs in _bindings_outside_torchrl()]


def _bindings_outside_torchrl() -> list[tuple]:
    """``(module name, module, attribute, TorchRL's class)`` for each replaced TorchRL class a module outside TorchRL
    (and tdcollect) holds."""
    if not _made:
        return []
    return [(module_name, module, attribute, value) for module_name, module in list(sys.modules.items())
            if not _is_torchrl_or_ours(module_name)
            for attribute, value in _bound_classes(module) if value in _made]


def _public_module_of(theirs: type) -> str:
    """The public module a TorchRL class is replaced in (the first of :data:`PUBLIC_MODULES` that names it)."""
    return next(module for module, names in PUBLIC_MODULES.items() if theirs.__name__ in names)


def _is_torchrl_or_ours(module_name: str) -> bool:
    top = module_name.split(".", 1)[0]
    return top in ("torchrl", "tdcollect")


def _bound_classes(module) -> list[tuple[str, type]]:
    """The ``(attribute, class)`` pairs of a module's namespace (an object that is no module, or whose namespace
    cannot be read, has none)."""
    try:
        namespace = vars(module)
    except TypeError:
        return []
    return [(attribute, value) for attribute, value in list(namespace.items()) if issubclass(type(value), type)]


def pending() -> list[str]:
    """The modules of :data:`PUBLIC_MODULES` :func:`install` has not done yet."""
    return [name for name in PUBLIC_MODULES if name not in _done]


def _ours_initializing(module_name: str, ran) -> bool:
    """Whether a tdcollect module whose classes replace ``module_name``'s is still running its body (TorchRL was
    imported by tdcollect's own import: its classes are not all defined yet; the replacing waits for its end).
    ``ran``: the modules whose bodies have run."""
    ours = {our_module for our_module, _ in PUBLIC_MODULES[module_name].values()}
    return any(name in sys.modules and not _ready(name) and name not in ran for name in ours)


def _ready(module_name: str) -> bool:
    """Whether ``module_name`` is imported and done initializing."""
    module = sys.modules.get(module_name)
    spec = getattr(module, "__spec__", None)
    return module is not None and not getattr(spec, "_initializing", False)


def uninstall() -> None:
    """TorchRL's classes back where :func:`install` put tdcollect's."""
    for module_name, names in PUBLIC_MODULES.items():
        module = sys.modules.get(module_name)
        for name in names:
            current = getattr(module, name, None) if module is not None else None
            if current is not None and hasattr(current, "torchrl_class"):
                setattr(module, name, current.torchrl_class)
    _done.clear()


def installed() -> bool:
    """Whether :func:`install` has run in this process (and not been undone)."""
    module = sys.modules.get("torchrl.envs")
    return module is not None and hasattr(getattr(module, "ParallelEnv", None), "torchrl_class")


def describe(replaced: list[str]) -> str:
    """The stderr line for what :func:`install` replaced."""
    by_module: dict[str, list[str]] = {}
    for dotted in replaced:
        module, name = dotted.rsplit(".", 1)
        by_module.setdefault(module, []).append(name)
    parts = [f"{module}.{{{', '.join(names)}}}" for module, names in by_module.items()]
    return "tdcollect's classes in place of " + "; ".join(parts)

