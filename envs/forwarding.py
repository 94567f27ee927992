"""Attribute and method forwarding: ``env.some_attr`` / ``env.some_method(...)`` on a batched env reach the envs
it runs (in its workers, or in this process), as with TorchRL's batched envs. The envs' side is
``engine.group.resolve_on_env``.

``env.name`` (a name the batched env itself lacks, held by its envs; ``__special__`` names never, ``_private`` ones
only while the env is open) returns an :class:`EnvAttribute`:

- ``env.name(*args, **kwargs)`` calls the method on every env: a list, one result per env (``env.name()`` on a
  plain attribute reads it);
- ``list(env.name)`` / ``env.name[i]`` / ``len(env.name)`` read the attribute: one value per env;
- ``env.name.sub`` chains (``env.nested.value``, ``env.nested.get_value()``).

Lists are per env, in env order (with ``envs_per_worker=1``, one per worker as in TorchRL). Values travel by
pickle, so a forwarded call is for configuration and inspection, not for the stepping loop.
"""
from __future__ import annotations


class EnvAttribute:
    """``path`` (attribute names from the env down) on every env of ``env``; evaluated when called, iterated,
    indexed or measured (see the module docstring)."""

    def __init__(self, env, path: tuple[str, ...]):
        self._env = env
        self._path = path

    def __call__(self, *args, **kwargs) -> list:
        return self._env.env_attribute(self._path, "call", args, kwargs)

    def values(self) -> list:
        """The attribute's value on every env."""
        return self._env.env_attribute(self._path, "get")

    def __iter__(self):
        return iter(self.values())

    def __len__(self) -> int:
        return len(self.values())

    def __getitem__(self, index):
        return self.values()[index]

    def __getattr__(self, name: str) -> EnvAttribute:
        if name.startswith("__"):
            raise AttributeError(f"special attributes are not forwarded to the envs (got {name!r}).")
        return EnvAttribute(self._env, (*self._path, name))

    def __repr__(self) -> str:
        return f"EnvAttribute({'.'.join(self._path)!r} on {self._env.num_envs} envs)"


class Forwarding:
    """What a batched env adds to forward names it lacks to its envs (see the module docstring); it needs
    ``_ensure_open()`` and ``_run_env_attribute(path, op, args, kwargs)`` (one result per env)."""

    def env_attribute(self, path: tuple[str, ...], op: str, args: tuple = (), kwargs: dict | None = None) -> list:
        """``op`` (``"has"``, ``"get"`` or ``"call"``) on the attribute ``path`` of every env; one result per
        env, in env order. ``env.name`` on this env returns a :class:`~tdcollect.envs.forwarding.EnvAttribute`
        that calls this."""
        self._ensure_open()
        return self._run_env_attribute(tuple(path), op, tuple(args), kwargs)

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)  # nn.Module: parameters, buffers, submodules
        except AttributeError:
            if name.startswith("__") or not self.__dict__.get("_forwarding", False):
                raise
            if name.startswith("_") and self.__dict__.get("is_closed", True):
                raise  # a private name never restarts a closed env
        if not self.env_attribute((name,), "has")[0]:
            owner = self.__dict__.get("owner", type(self).__name__)
            raise AttributeError(f"neither {owner} nor its envs have an attribute {name!r}.")
        return EnvAttribute(self, (name,))
