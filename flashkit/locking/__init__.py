"""Locking: every lockfile the kit commits, written with uv (needs PyPI), all of one set or none.

- :mod:`flashkit.locking.env_lock`: an env's lockfiles (``lockfiles/<id>/``), for every Python its torch supports;
- :mod:`flashkit.locking.kit_lock`: the kit's own dependencies (``lockfiles/kit.txt``), and its offline check;
- :mod:`flashkit.locking.uv`: where uv is found.

What an env's lockfile holds and its offline checks are :mod:`flashkit.plan.lock`: the planner reads an env's
lockfiles as inputs of its image (and of the input hash), and the planner runs no tool. A Debian base's lock
(``lockfiles/<id>/base.txt``) is made by mmdebstrap: :mod:`flashkit.images.base`.
"""
