"""``canopy route ...`` (offline replay) and ``canopy serve router`` (the routing proxy)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from canopy.reporting import output_path

__all__ = ["register"]

route_app = typer.Typer(no_args_is_help=True,
                        help="Model routing: offline bandit replay and agent routing.")
serve_app = typer.Typer(no_args_is_help=True, help="HTTP services.")


def _floats(text: str | None) -> list[float] | None:
    if text is None or text == "auto":
        return None
    try:
        return [float(x) for x in text.replace(",", " ").split()]
    except ValueError:
        raise typer.BadParameter(f"--lambdas must be numbers or 'auto', got {text!r}") from None


@route_app.command("replay")
def replay_command(
    dataset: str = typer.Option(..., "--dataset", help="registered name or a .csv/.jsonl/"
                                ".pkl file"),
    lambdas: str = typer.Option("auto", "--lambdas", help="cost weights, e.g. '0 10 100'"),
    seeds: int = typer.Option(10, "--seeds", min=1),
    routers: str | None = typer.Option(None, "--routers", help="comma-separated names"),
    region_depth: int | None = typer.Option(None, "--region-depth",
                                            help="routellm-mmlu: 1, 2 or 3 levels"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
    plot: Annotated[Path | None, typer.Option("--plot", help="write the figure here",
                                                         callback=output_path)] = None,
    trust_pickle: bool = typer.Option(False, "--trust-pickle",
                                      help="read a .pkl data set (unpickling runs its code)"),
    train_fraction: float | None = typer.Option(
        None, "--train-fraction", help="warm start: fit every learner on the first F of each "
        "seed's shuffled queries, score every router on the rest"),
    prior_count: float | None = typer.Option(
        100.0, "--prior-count", help="with --train-fraction: a region's log weighs at most "
        "this many observations per model (0: every logged outcome counts as one)"),
) -> None:
    """Replay routers on logged outcomes over a sweep of lambda."""
    from rich.console import Console
    from rich.table import Table

    from canopy.apps.routing.datasets import load
    from canopy.apps.routing.replay import replay

    options = {} if region_depth is None else {"depth": region_depth}
    outcomes = load(dataset, trust_pickle=trust_pickle, **options)
    names = None if routers is None else [r.strip() for r in routers.split(",") if r.strip()]
    if train_fraction is not None and not 0 < train_fraction < 1:
        raise typer.BadParameter(f"--train-fraction must be in (0, 1), got {train_fraction}")
    if prior_count is not None and prior_count < 0:
        raise typer.BadParameter(f"--prior-count must be >= 0, got {prior_count}")
    result = replay(outcomes, lambdas=_floats(lambdas), seeds=seeds, routers=names,
                    train_fraction=train_fraction, max_count=prior_count or None)
    if plot is not None:
        from canopy.apps.routing.plots import plot_replay
        from canopy.plotting import announce_plot

        plot_replay(result, plot)
        announce_plot(plot)
    summary = result.to_dict()
    if as_json:
        typer.echo(json.dumps(summary))
        return
    console = Console()
    table = Table(title=f"{outcomes.name}: {outcomes.n_queries} queries, "
                        f"{outcomes.n_models} models, {len(result.seeds)} seeds")
    for column in ("router", "AIQ", "lambda", "quality", "cost ($)", "regret"):
        table.add_column(column)
    for name, entry in summary["routers"].items():
        for i, point in enumerate(entry["points"]):
            table.add_row(name if i == 0 else "",
                          f"{entry['aiq']:.4f} ± {entry['aiq_ci95']:.4f}" if i == 0 else "",
                          f"{point['lambda']:.4g}",
                          f"{point['quality']:.4f} ± {point['quality_ci95']:.4f}",
                          f"{point['cost']:.3g}", f"{point['regret']:.1f}")
    console.print(table)
    if "fixed_hull" in summary:
        console.print(f"AIQ of the fixed models' hull: {summary['fixed_hull']['aiq']:.4f}")


@route_app.command("agents")
def agents_command(
    episodes: int = typer.Option(2000, "--episodes", help="episodes per replicate"),
    replicates: int = typer.Option(10, "--replicates", help="seeded replicates"),
    lam: float = typer.Option(5.0, "--lam", help="cost weight (quality per dollar)"),
    learners: str = typer.Option("regional,flat,regional-percall", "--learners"),
    bandit: str = typer.Option("thompson", "--bandit", help="thompson or ucb"),
    seed: int = typer.Option(0, "--seed"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Per-call routing inside a multi-turn agent: regional (region = turn phase and
    difficulty) against flat, the episode's terminal reward credited to every call."""
    from canopy.apps.routing.agents import run_agents, summarize_agents
    from canopy.reporting import print_table, progress_bar

    if lam < 0:
        raise typer.BadParameter(f"--lam must be >= 0, got {lam}")
    names = [x.strip() for x in learners.split(",") if x.strip()]
    with progress_bar("agent episodes", replicates * len(names), enabled=not as_json) as tick:
        results = run_agents(episodes=episodes, replicates=replicates, lam=lam, learners=names,
                             bandit=bandit, seed=seed, progress=tick)
    summary = summarize_agents(results, lam)
    if as_json:
        typer.echo(json.dumps(summary))
        return
    rows = [{"learner": r["learner"], **{
        key: f"{r[key]:.3f} [{r[key + '_ci'][0]:.3f}, {r[key + '_ci'][1]:.3f}]"
        if r[key + "_ci"][0] is not None else f"{r[key]:.3f}"
        for key in ("utility", "utility_last", "success", "oracle_match")}} for r in
        summary["rows"]]
    print_table(rows, ["learner", "utility", "utility_last", "success", "oracle_match"],
                title=f"agent routing, {episodes} episodes x {replicates} replicates, lam "
                      f"{lam:g} (mean [95% CI])")
    typer.echo(f"oracle per-phase policy: utility {summary['oracle']['utility']:.3f}; best "
               f"single model ({summary['best_single_model']['model']}): "
               f"{summary['best_single_model']['utility']:.3f}")


@serve_app.command("router")
def serve_router(config: Annotated[Path, typer.Option("--config", exists=True,
                                                     dir_okay=False)],
                 host: str = typer.Option("127.0.0.1", "--host", help="Interface to bind "
                                          "(loopback unless told otherwise)."),
                 port: int = typer.Option(8080, "--port"),
                 workers: int = typer.Option(1, "--workers", min=1, help="Worker processes "
                                             "sharing the state file."),
                 insecure_no_auth: bool = typer.Option(
                     False, "--insecure-no-auth", help="Serve without API keys (only when "
                     "the configuration names none; never on a shared network)."),
                 prior: Annotated[Path | None, typer.Option(
                     "--prior", exists=True, dir_okay=False, help="Warm start: a log in the "
                     "long format (query_id,region,model,quality,cost; .csv or .jsonl) the "
                     "router is fitted on at start, kept under the stored ratings.")] = None
                 ) -> None:
    """Run the OpenAI-compatible routing proxy (needs the ``serve`` extra). Clients present
    the keys the configuration's ``auth`` names (``Authorization: Bearer ...``)."""
    import os

    import uvicorn  # noqa: F401  (the serve extra: a missing one is named before the config)

    from canopy.apps.routing.proxy.app import (
        CONFIG_ENV,
        INSECURE_ENV,
        PRIOR_ENV,
        create_app,
        read_prior,
    )
    from canopy.apps.routing.proxy.config import ProxyConfig
    from canopy.apps.routing.proxy.connections import serve, uvicorn_config
    from canopy.apps.routing.proxy.upstreams import unanswered

    settings = ProxyConfig.from_file(config)
    for upstream in settings.upstreams:
        down = unanswered(upstream) if len(upstream.replicas) > 1 else []
        if down and len(down) == len(upstream.replicas):
            raise ValueError(f"no replica of {upstream.model!r} answers: {', '.join(down)}")
    app = create_app(settings, insecure_no_auth=insecure_no_auth,
                     prior=None if prior is None else read_prior(prior))
    if workers > 1:  # each worker builds its own app
        os.environ[CONFIG_ENV] = str(config.resolve())
        os.environ[INSECURE_ENV] = "1" if insecure_no_auth else ""
        os.environ[PRIOR_ENV] = "" if prior is None else str(prior.resolve())
        app = "canopy.apps.routing.proxy.app:app_from_env"
    serve(uvicorn_config(app, settings.limits, upstreams=len(settings.upstreams), host=host,
                         port=port, workers=workers))


def register(app: typer.Typer) -> None:
    """Add the ``route`` and ``serve`` groups to the ``canopy`` app."""
    app.add_typer(route_app, name="route")
    app.add_typer(serve_app, name="serve")
