"""``canopy trim run``: the regional trim-level bandit (BBH tasks or MMLU subjects as regions)
against every fixed trim and the per-task and per-item oracles, live against an
OpenAI-compatible endpoint."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console

from canopy.plotting import announce_plot
from canopy.reporting import (
    BaseUrl,
    CacheDir,
    Json,
    Model,
    Plot,
    Seed,
    Timeout,
    cli_error,
    interval_cells,
    plot_accuracy,
    print_json,
    print_table,
    progress_bar,
)

__all__ = ["register", "trim_app"]

trim_app = typer.Typer(no_args_is_help=True, add_completion=False,
                       help="Prompt trimming: a regional bandit over trim levels (tasks as "
                            "regions).")

_COLUMNS = ["method", "accuracy [95% CI]", "tokens", "requested_tokens", "estimated_tokens",
            "reward", "delta [95% CI]", "delta_against"]


@trim_app.command("run")
def run_command(
    base_url: BaseUrl = None,
    model: Model = None,
    task: Annotated[str, typer.Option("--task", help="Benchmark: bbh (3-shot CoT prompts) or "
                                      "mmlu (5-shot dev prompts).")] = "bbh",
    tasks: Annotated[str | None, typer.Option(
        "--tasks", help="Comma-separated categories: BBH tasks or MMLU subjects (default: "
        "four of the benchmark's).")] = None,
    n: Annotated[int, typer.Option("--n", help="Items per task.")] = 10,
    offset: Annotated[int, typer.Option("--offset", help="First item of each task.")] = 0,
    budget_tokens: Annotated[int | None, typer.Option(
        "--budget-tokens", help="Requested prompt tokens of the truncation and BM25 "
        "levels (default: 320 for bbh, 200 for mmlu).")] = None,
    lam: Annotated[float, typer.Option("--lam", help="Reward = correct - lam * input "
                                       "tokens.")] = 2e-4,
    max_tokens: Annotated[int, typer.Option("--max-tokens", help="Tokens per answer.")] = 48,
    orders: Annotated[int, typer.Option("--orders", help="Random item orders for the "
                                        "bandit.")] = 20,
    learner: Annotated[str, typer.Option(
        "--learner", help="Regional learner: ucb or thompson.")] = "ucb",
    explore: Annotated[float, typer.Option(
        "--explore", help="UCB exploration constant (routing's explore).")] = 1.0,
    sharing: Annotated[str, typer.Option(
        "--sharing", help="How a task shares the pool of all tasks: test (until a test "
        "separates them), anytime (a time-uniform test), or backoff (a fixed weight, "
        "--kappa).")] = "test",
    kappa: Annotated[float, typer.Option(
        "--kappa", help="Back-off weight of the pool of all tasks, in pseudo-items "
        "(--sharing backoff).")] = 5.0,
    seed: Seed = 0,
    cache_dir: CacheDir = None,
    timeout: Timeout = 120.0,
    as_json: Json = False,
    plot: Plot = None,
) -> None:
    """Collect every trim level's answer on BBH or MMLU items, then compare the regional
    bandit with every fixed trim level (at matched tokens) and the per-task and per-item
    oracles."""
    from canopy.apps.trim.benchmarks import BENCHMARKS, load_benchmark
    from canopy.apps.trim.run import collect, summarise
    from canopy.llm.local import LocalServerError, open_endpoint
    from canopy.regional.router import RegionalRouter

    console = Console(stderr=True)
    try:
        if task not in BENCHMARKS:
            raise ValueError(f"--task must be one of {', '.join(BENCHMARKS)}, got {task!r}")
        names = None if tasks is None else [t.strip() for t in tasks.split(",") if t.strip()]
        if names is not None and not names:
            raise ValueError("--tasks is empty")
        if n < 1:
            raise ValueError(f"--n must be >= 1, got {n}")
        if orders < 1:
            raise ValueError(f"--orders must be >= 1, got {orders}")
        # the bandit's settings are checked before any call is spent
        RegionalRouter(["check"], lam=lam, learner=learner, explore=explore, sharing=sharing,
                       kappa=kappa)
        loaded = load_benchmark(task, names, n=n, offset=offset, budget_tokens=budget_tokens)
        with open_endpoint(base_url, model=model, cache_dir=cache_dir, timeout=timeout) as (
                client, server):
            total = sum(len(items) for _, items in loaded.tasks.values())
            with progress_bar("trim", total, enabled=not as_json) as update:
                run = collect(client, loaded.tasks, loaded.levels, max_tokens=max_tokens,
                              grader=loaded.grader, progress=update)
            usage = client.usage
            requests = server.request_count if server is not None else None
        rows = summarise(run, lam=lam, learner=learner, explore=explore, sharing=sharing,
                         kappa=kappa, n_orders=orders, seed=seed)
    except (ValueError, FileNotFoundError, LocalServerError) as error:
        raise cli_error(error) from None
    if run.error is not None:
        console.print(f"[yellow]stopped early:[/yellow] {run.error}; {run.completed} of "
                      f"{len(run.items)} items kept")
    title = BENCHMARKS[task].title
    if plot is not None and rows:
        plot_accuracy(rows, plot, x="tokens", title=f"{title} trimming: accuracy vs input tokens",
                      xlabel="mean input tokens per item")
        announce_plot(plot)
    meta = {"task": task, "items": run.completed, "requested": len(run.items), "error": run.error,
            "lam": lam, "learner": learner, "explore": explore, "sharing": sharing,
            "kappa": kappa,
            "http_calls": usage.calls,
            "cache_hits": usage.cache_hits, "server_requests": requests}
    if as_json:
        print_json({**meta, "rows": rows})
    else:
        print_table([interval_cells(row) for row in rows], _COLUMNS,
                    title=f"{title} trimming: {run.completed} items over "
                    f"{len(loaded.tasks)} {'subjects' if task == 'mmlu' else 'tasks'}, "
                    f"lambda = {lam:g} per token")
        Console().print(f"HTTP calls {usage.calls}, cache hits {usage.cache_hits}"
                        + (f", server requests {requests}" if requests is not None else ""))
    if run.error is not None:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add the ``trim`` command group."""
    app.add_typer(trim_app, name="trim")
