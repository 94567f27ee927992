"""Collectors spread over machines: ``ray.py`` (:class:`RayCollector`, on a Ray cluster; needs the optional ``ray``
package, ``pip install "tdcollect[ray]"``, imported on first use)."""

__all__ = ["RayCollector"]


def __getattr__(name):
    if name == "RayCollector":
        from .ray import RayCollector

        return RayCollector
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
