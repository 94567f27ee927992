"""Collectors that step policies against tdcollect envs (see the collectors issue)."""
