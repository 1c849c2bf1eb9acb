"""``canopy`` command line: thin; parses, calls the library, prints with rich.

Each part of the library contributes its commands through a ``register(app)`` function in
its own ``cli`` module, listed in :data:`COMMAND_MODULES`.
"""

from __future__ import annotations

import importlib

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="Canopy: multi-fidelity tree bandits and their LLM-inference uses.")

COMMAND_MODULES = (
    "canopy.commands",            # demo, bench
    "canopy.experiments.cli",     # run, list, reproduce
    "canopy.apps.cache.cli",      # cache ...
    "canopy.apps.routing.cli",    # route ..., serve router
    "canopy.apps.topk.cli",       # topk
    "canopy.apps.search.cli",     # search ...
    "canopy.apps.trim.cli",       # trim ...
)


def _register_all() -> None:
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as error:
            if error.name is not None and name.startswith(error.name):
                continue  # that part of the library is not in this build
            raise
        module.register(app)


_register_all()


def main() -> None:
    app()
