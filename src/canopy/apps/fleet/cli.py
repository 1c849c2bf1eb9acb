"""``canopy fleet sim``: rank the replica policies on a trace replayed through N simulated
replicas, at several loads and seeds; ``canopy fleet bench``: the routers side by side in
front of live engine replicas."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from canopy.reporting import output_path

__all__ = ["register"]

fleet_app = typer.Typer(no_args_is_help=True,
                        help="Many replicas of one model: replica policies in simulation "
                             "and live.")

ALL = "round_robin,least_load,power_of_two,prefix_hash,sglang,dynamo,llmd,canopy"


def _numbers(text: str, what: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter(f"{what} must be comma-separated numbers, got {text!r}"
                                 ) from None
    if not values or min(values) <= 0:
        raise typer.BadParameter(f"{what} must be numbers > 0, got {text!r}")
    return values


def _cell(value: dict) -> str:
    return f"{value['mean']:.3f} [{value['lo']:.2f}, {value['hi']:.2f}]"


@fleet_app.command("sim")
def sim_command(
    trace: str = typer.Option("conversation", help="conversation, synthetic, toolagent or a "
                              "Mooncake-format JSONL file"),
    replicas: int = typer.Option(8, help="replicas (at most 64)"),
    capacity: int = typer.Option(0, help="KV blocks per replica (0: an N-th of the trace's "
                                 "distinct blocks)"),
    load: str = typer.Option("0.5,0.7,0.9", help="prefill work of every prompt token over "
                             "the fleet's capacity"),
    policies: str = typer.Option(ALL, help="replica policies, comma-separated"),
    seeds: int = typer.Option(5, help="seeds per cell"),
    eviction: str = typer.Option("lru", help="replica eviction: lru (vLLM's order) or canopy"),
    engine: str = typer.Option("serial", help="replica prefill: serial (one request at a time, "
                               "llama.cpp) or batched (a step prefills every waiting request, "
                               "vLLM)"),
    cores: float = typer.Option(0.0, help="replicas' worth of compute the replicas share "
                                "(0: each its own)"),
    ms_per_token: float = typer.Option(0.1, help="TTFT model: prefill ms per uncached token "
                                       "(the calibration of 'canopy cache live')"),
    overhead_ms: float = typer.Option(20.0, help="TTFT model: fixed ms per request"),
    calibration: Annotated[Path | None, typer.Option(
        help="TTFT model from a calibration file of 'canopy cache live --calibration-out' "
             "(replaces --ms-per-token and --overhead-ms)")] = None,
    tpot_ms: float = typer.Option(20.0, help="decode ms per output token (holds blocks)"),
    every_fixed: bool = typer.Option(False, "--every-fixed", help="also a row per fixed "
                                     "trade-off of best_fixed's grid"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
    plot: Annotated[Path | None, typer.Option(help="figure of the TTFT CDFs and the learnt "
                                              "trade-off (needs matplotlib)",
                                              callback=output_path)] = Path("canopy-fleet.png"),
) -> None:
    """Replay a trace through N simulated replicas under each replica policy: TTFT p50/p90/p99
    (mean and 95% interval over seeds), hit rate, load imbalance and decision time, with
    the best fixed trade-off and the oracle as references."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn
    from rich.table import Table

    from canopy.apps.fleet.sim import ENGINES, load_trace, sweep
    from canopy.fleet.policies import NAMES
    from canopy.reporting import progress_lines

    names = [p.strip() for p in policies.split(",") if p.strip()]
    unknown = [p for p in names if p not in NAMES]
    if not names or unknown:
        raise typer.BadParameter(f"--policies: unknown policy {', '.join(unknown) or policies!r}"
                                 f"; known: {', '.join(NAMES)}")
    if eviction not in ("lru", "canopy"):
        raise typer.BadParameter(f"--eviction must be lru or canopy, got {eviction!r}")
    if engine not in ENGINES:
        raise typer.BadParameter(f"--engine must be one of {', '.join(ENGINES)}, got "
                                 f"{engine!r}")
    if cores < 0:
        raise typer.BadParameter(f"--cores must be >= 0, got {cores:g}")
    loads = _numbers(load, "--load")
    from canopy.prefix.ttft import TTFTModel, load_calibration

    ttft = (TTFTModel(ms_per_token=ms_per_token, overhead_ms=overhead_ms) if calibration is None
            else load_calibration(calibration))  # checks both
    ms_per_token, overhead_ms = ttft.ms_per_token, ttft.overhead_ms
    fleet_trace = load_trace(trace)
    capacity = capacity or max(1, fleet_trace.working_set // max(replicas, 1))
    console = Console(stderr=True)
    with Progress("[progress.description]{task.description}", BarColumn(),
                  MofNCompleteColumn(), TimeRemainingColumn(), console=console,
                  disable=not console.is_terminal) as bar:
        task = bar.add_task("replays", total=None)
        lines = None if console.is_terminal else progress_lines("replays", console)

        def advance(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)
            if lines is not None:
                lines(done, total)

        rows, runs = sweep(fleet_trace, n_replicas=replicas, capacity=capacity, loads=loads,
                           names=names, seeds=seeds, ms_per_token=ms_per_token,
                           overhead_ms=overhead_ms, tpot_ms=tpot_ms, every_fixed=every_fixed,
                           eviction=eviction, engine=engine, cores=cores or None,
                           progress=advance)
    out = {"trace": fleet_trace.name, "replicas": replicas, "capacity": capacity,
           "seeds": seeds, "eviction": eviction, "engine": engine, "cores": cores or None,
           "ttft_model": {"ms_per_token": ms_per_token, "overhead_ms": overhead_ms,
                          "source": str(calibration) if calibration else "options"},
           "results": rows}
    if as_json:
        typer.echo(json.dumps(out))
        return
    table = Table(title=f"{fleet_trace.name}: {replicas} replicas x {capacity:,} blocks, "
                        f"TTFT (s), mean [95% CI] over {seeds} seeds")
    for column in ("load", "policy", "index", "p50", "p90", "p99", "hit", "load cv", "us"):
        table.add_column(column, justify="left" if column in ("policy", "index") else "right")
    for row in rows:
        us = row["decision_us_p50"]
        table.add_row(f"{row['load']:g}", row["policy"] + (f" ({row['theta']:g})"
                                                           if "theta" in row else ""),
                      row["index"], _cell(row["ttft_p50_s"]), _cell(row["ttft_p90_s"]),
                      _cell(row["ttft_p99_s"]), f"{row['hit_rate']:.3f}",
                      f"{row['load_cv']:.3f}", "" if us is None else f"{us:.1f}")
    Console().print(table)
    if plot is not None:
        try:
            from canopy.apps.fleet.plots import plot_fleet

            plot_fleet(runs, loads, plot, title=f"{fleet_trace.name}, {replicas} replicas")
            Console().print(f"plot written to {plot.resolve()}")
        except ImportError:
            Console().print("matplotlib is not installed (pip install 'canopy-bandits[plots]')"
                            ": no plot written")


def _live_cell(value: dict) -> str:
    return f"{value['mean']:.3f} [{value['lo']:.3f}, {value['hi']:.3f}]"


@fleet_app.command("bench")
def bench_command(
    engine: str = typer.Option("llama", help="vllm (vLLM's CPU build, .venv-vllm) or llama "
                               "(llama.cpp)"),
    replicas: int = typer.Option(2, help="engine replicas behind each router"),
    peers: str = typer.Option("sglang-router,vllm-router", help="peer routers, "
                              "comma-separated: sglang-router, vllm-router, round-robin, "
                              "least-load (the last two chosen by the client)"),
    canopy: bool = typer.Option(True, "--canopy/--no-canopy", help="Canopy's gateway too"),
    workload: str = typer.Option("zipf", help="zipf, conversation or synthetic"),
    requests: int = typer.Option(240, help="requests per repeat"),
    concurrency: int = typer.Option(4, help="requests in flight per router"),
    repeats: int = typer.Option(3, help="repeats (fresh prompts each)"),
    seed: int = typer.Option(0, help="seed of the first repeat's prompts"),
    max_tokens: int = typer.Option(4, help="tokens generated per request"),
    blocks: int = typer.Option(48, help="vLLM: KV pool per replica in blocks"),
    capacity_mb: float = typer.Option(4.0, help="llama.cpp: cache per replica in MiB"),
    trace_out: Annotated[Path | None, typer.Option(
        help="the stream in Mooncake format (default: a temporary file)",
        callback=output_path)] = None,
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Start N engine replicas per router on loopback, Canopy's gateway and each peer router
    in front of them, send the same interleaved request stream through each: TTFT p50/p90
    (mean and 95% interval over repeats), the engines' hit rate, requests lost, and the
    simulator's prediction for the same stream."""
    from rich.console import Console
    from rich.table import Table

    from canopy.apps.fleet.bench import (
        ENGINES,
        PEERS,
        ROUTERS,
        MissingPeer,
        peer_binary,
        run_bench,
    )

    names = [p.strip() for p in peers.split(",") if p.strip()]
    routers = (["canopy"] if canopy else []) + names
    unknown = [p for p in names if p not in ROUTERS or p == "canopy"]
    if unknown or not routers or len(set(routers)) < len(routers):
        raise typer.BadParameter(f"--peers: unknown or repeated router "
                                 f"{', '.join(unknown) or peers!r}; known: "
                                 f"{', '.join(r for r in ROUTERS if r != 'canopy')}")
    if engine not in ENGINES:
        raise typer.BadParameter(f"--engine must be one of {', '.join(ENGINES)}, got "
                                 f"{engine!r}")
    if workload not in ("zipf", "conversation", "synthetic"):
        raise typer.BadParameter(f"--workload must be zipf, conversation or synthetic, got "
                                 f"{workload!r}")
    for value, what in ((replicas, "--replicas"), (requests, "--requests"),
                        (concurrency, "--concurrency"), (repeats, "--repeats"),
                        (max_tokens, "--max-tokens"), (blocks, "--blocks")):
        if value < 1:
            raise typer.BadParameter(f"{what} must be >= 1, got {value}")
    if capacity_mb <= 0:
        raise typer.BadParameter(f"--capacity-mb must be > 0, got {capacity_mb:g}")
    for name in names:
        if name in PEERS:
            try:
                peer_binary(name)
            except MissingPeer as error:
                raise typer.BadParameter(str(error)) from None
    from canopy.engines.processes import ended_by_signals  # SIGTERM: every engine stopped

    with ended_by_signals():
        out = run_bench(engine=engine, replicas=replicas, routers=routers, workload=workload,
                        requests=requests, concurrency=concurrency, repeats=repeats,
                        seed=seed, blocks=blocks, capacity_mb=capacity_mb,
                        max_tokens=max_tokens, trace_out=trace_out)
    if as_json:
        typer.echo(json.dumps(out))
        return
    table = Table(title=f"{out['workload']}, {engine}, {replicas} replicas per router, "
                        f"{requests} requests x {repeats} repeats at concurrency "
                        f"{concurrency}: TTFT (s), mean [95% CI]; simulator beside")
    for column in ("router", "p50", "p90", "hit", "lost", "sim p50", "sim p90", "sim hit"):
        table.add_column(column, justify="left" if column == "router" else "right")
    sim = out["simulator"]["results"]
    for name in sim:
        live, predicted = out["results"].get(name), sim.get(name)
        cells = ["", "", "", ""] if live is None else [
            _live_cell(live["ttft_p50_s"]), _live_cell(live["ttft_p90_s"]),
            f"{live['hit_rate']:.3f}", str(live["lost"])]
        table.add_row(name, *cells, f"{predicted['ttft_p50_s']['mean']:.3f}",
                      f"{predicted['ttft_p90_s']['mean']:.3f}", f"{predicted['hit_rate']:.3f}")
    Console().print(table)
    order, replayed = out["ranking"], out["simulator"]
    shared = "" if replayed["cores"] is None else f", {replayed['cores']:g} cores"
    Console().print(f"by TTFT p90, live: {' < '.join(order['live'])}; simulator "
                    f"({replayed['engine']} replicas{shared}): "
                    f"{' < '.join(order['simulator'])} ({'same' if order['same'] else 'differ'})")
    for name, live in out["results"].items():
        if "cached_prediction" in live:
            hits = live["cached_prediction"]
            Console().print(f"{name}: its index predicted the engines' cached tokens exactly "
                            f"on {hits['exact']:.1%} of {hits['requests']} requests")
    Console().print(f"stream written in Mooncake format to {out['trace']}")


def register(app: typer.Typer) -> None:
    """Add the ``fleet`` command group to the ``canopy`` app."""
    app.add_typer(fleet_app, name="fleet")
