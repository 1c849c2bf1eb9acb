"""``canopy cache replay``: replay a trace under eviction policies at several capacities;
``canopy cache live``: the policies inside a running llama.cpp engine, time to first token."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer

from canopy.reporting import output_path

__all__ = ["register"]

cache_app = typer.Typer(no_args_is_help=True,
                        help="Prefix-cache eviction: replay traces, measure a live engine.")


def _policy_specs(text: str, *, engine: str, online: bool, extra: tuple[str, ...] = ()
                  ) -> list[str]:
    """The policies of ``--policies``: built-in names, ``extra`` names of the command, or
    ``package.module:ClassName`` (a policy class of the user's own; a module in the current
    folder is found, as ``python -m`` finds it). Each is checked now, one line if bad."""
    import sys

    from canopy.prefix.policies import resolve_policy

    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    specs = [p.strip() for p in text.split(",") if p.strip()]
    if not specs:
        raise typer.BadParameter(f"--policies names no policy, got {text!r}")
    for spec in specs:
        if spec not in extra:
            try:
                resolve_policy(spec, online=online)
            except (ValueError, TypeError) as error:
                raise typer.BadParameter(f"--policies with --engine {engine}: {error}"
                                         ) from None
    return specs


def _ints(text: str, what: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter(f"{what} must be comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise typer.BadParameter(f"{what} must be positive integers, got {text!r}")
    return values


@cache_app.command("replay")
def replay_command(
    trace: str = typer.Option("conversation", help="conversation, synthetic, toolagent or a "
                              "file (Mooncake JSONL or a prompt log)"),
    capacity: str = typer.Option("16,64,256,1024,4096", help="capacities in blocks"),
    policies: str = typer.Option("lru,lfu,canopy,optimal", help="policies: lru, lfu, sieve, "
                                 "canopy, optimal or package.module:ClassName (your own)"),
    scenario: str = typer.Option("stationary", help="stationary or shift"),
    before: str | None = typer.Option(None, help="pre-shift workload (default: the trace "
                                      "itself in a disjoint block space)"),
    block_size: int = typer.Option(16, help="tokens a block for prompt logs"),
    ms_per_token: float = typer.Option(0.1, help="TTFT model: prefill ms per uncached token"),
    calibration: Annotated[Path | None, typer.Option(
        help="TTFT model from a calibration file of 'canopy cache live --calibration-out' "
             "(overrides --ms-per-token)")] = None,
    window: int = typer.Option(500, help="requests per point of the shift recovery curve"),
    seed: int = typer.Option(0, help="canopy: seed of the shadows' spatial sample and of "
                             "their sampled evictions"),
    engine: str = typer.Option("canopy", help="canopy (Canopy's replay) or sglang (SGLang's "
                               "own radix cache, policies lru, lfu, canopy or your own "
                               "priority policy; extra 'sglang')"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
    plot: Annotated[Path | None, typer.Option(help="write a figure (needs matplotlib)",
                                              callback=output_path)] = None,
) -> None:
    """Blocks reused per request, hit ratio, TTFT saved and replay speed per policy/capacity."""
    from rich.console import Console
    from rich.table import Table

    from canopy.apps.cache.live import load_calibration
    from canopy.apps.cache.replay import recovery_curve, sweep
    from canopy.prefix.policies import make_policy, resolve_policy
    from canopy.prefix.traces import resolve
    from canopy.prefix.ttft import TTFTModel

    capacities = _ints(capacity, "--capacity")
    if window < 1:
        raise typer.BadParameter(f"--window must be >= 1 request, got {window}")
    specs = _policy_specs(policies, engine=engine, online=engine == "sglang")
    try:
        chosen = [make_policy(p, seed=seed) if p == "canopy" else resolve_policy(p)
                  for p in specs]
        ttft = TTFTModel(ms_per_token=ms_per_token) if calibration is None else \
            load_calibration(calibration)
        loaded = resolve(trace, block_size=block_size)
        pre = None if before is None else resolve(before, block_size=block_size)
    except (ValueError, FileNotFoundError) as error:
        raise typer.BadParameter(str(error)) from None
    if scenario not in ("stationary", "shift"):
        raise typer.BadParameter(f"--scenario must be stationary or shift, got {scenario!r}")
    if engine not in ("canopy", "sglang"):
        raise typer.BadParameter(f"--engine must be canopy or sglang, got {engine!r}")
    if engine == "sglang":
        from canopy.apps.cache import sglang_replay as sglang

        try:
            results = sglang.sweep(loaded, policies=chosen,
                                   capacities=capacities, scenario_name=scenario, before=pre,
                                   ttft=ttft)
        except ImportError as missing:
            raise typer.BadParameter(f"--engine sglang needs SGLang (pip install "
                                     f"'canopy-bandits[sglang]'): {missing}") from None
        except ValueError as error:
            raise typer.BadParameter(str(error)) from None
    else:
        results = sweep(loaded, policies=chosen, capacities=capacities,
                        scenario_name=scenario, before=pre, ttft=ttft)
    out: dict = {"trace": loaded.name, "engine": engine, "scenario": scenario,
                 "requests_counted": len(results[0].reused),
                 "ttft_model": {"ms_per_token": ttft.ms_per_token, "overhead_ms": ttft.overhead_ms,
                                "source": "default" if calibration is None and ms_per_token == 0.1
                                else str(calibration or "--ms-per-token")},
                 "results": {}}
    for r in results:
        entry = r.metrics()
        if scenario == "shift":
            entry["recovery"] = recovery_curve(r, window=window).round(4).tolist()
        out["results"].setdefault(r.policy, {})[str(r.capacity)] = entry
    if as_json:
        typer.echo(json.dumps(out))
    else:
        table = Table(title=f"{loaded.name}, {scenario}: blocks reused per request")
        table.add_column("capacity", justify="right")
        for p in chosen:
            table.add_column(p.name, justify="right")
        for c in capacities:
            cells = (out["results"][p.name][str(c)]["blocks_reused_per_request"] for p in chosen)
            table.add_row(str(c), *(f"{x:.3f}" for x in cells))
        Console().print(table)
    if plot is not None:
        _plot(out, capacities, window, plot)
        from canopy.plotting import announce_plot

        announce_plot(plot)


def _plot(out: dict, capacities: list[int], window: int, file: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from canopy.plotting import distinct_series

    shift = out["scenario"] == "shift"
    fig, axes = plt.subplots(1, 2 if shift else 1, figsize=(10 if shift else 5, 3.6),
                             squeeze=False)
    names = list(out["results"])
    reuse = [[out["results"][n][str(c)]["blocks_reused_per_request"] for c in capacities]
             for n in names]
    for y, style in zip(reuse, distinct_series(names, reuse, [capacities] * len(names)),
                        strict=True):
        axes[0][0].plot(style.along_log(capacities, max(capacities) / min(capacities)), y,
                        label=style.label,
                        **style.kwargs)
    if shift:
        curves = [out["results"][n][str(capacities[-1])]["recovery"] for n in names]
        steps = [[(i + 1) * window for i in range(len(curve))] for curve in curves]
        for curve, style in zip(curves, distinct_series(names, curves, steps), strict=True):
            axes[0][1].plot(style.along(steps[0][:len(curve)], window * len(curve)), curve,
                            label=style.label, markevery=max(len(curve) // 8, 1),
                            **style.kwargs)
        axes[0][1].legend(fontsize=7)
    axes[0][0].set(xscale="log", xlabel="capacity (blocks)", ylabel="blocks reused / request",
                   title=f"{out['trace']} ({out['scenario']})")
    axes[0][0].legend()
    if shift:
        axes[0][1].set(xlabel="requests after the shift", ylabel="blocks reused / request",
                       title=f"recovery at {capacities[-1]} blocks")
    fig.tight_layout()
    fig.savefig(file, dpi=120)
    plt.close(fig)


def _cores() -> int:
    """CPU cores this process may run on."""
    import os

    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1




@cache_app.command("live")
def live_command(
    policies: str = typer.Option("off,lru,canopy", help="off (no caching), lru, lfu, sieve, "
                                 "canopy, optimal (knows the workload's future; llama only), "
                                 "vllm (vLLM's own eviction; vllm only), or "
                                 "package.module:ClassName (a policy of your own)"),
    engine: str = typer.Option("llama", help="llama (llama.cpp, SmolLM2-135M GGUF) or vllm "
                               "(vllm serve with Canopy's eviction plugin)"),
    capacity_mb: float = typer.Option(6.0, help="llama: KV memory of the cache (MiB)"),
    blocks: int = typer.Option(48, help="vllm: KV pool in blocks (vLLM keeps one as its null "
                               "block and one for the running request's last block)"),
    scenario: str = typer.Option("shift", help="stationary or shift (count after the shift)"),
    workload: str = typer.Option("zipf", help="zipf (system prompts and few-shot contexts), "
                                 "conversation or synthetic (a Mooncake trace's prefixes)"),
    requests: int = typer.Option(80, help="requests a run"),
    repeats: int = typer.Option(1, help="runs per policy, on workloads of seeds seed, seed+1..."),
    seed: int = typer.Option(0, help="workload seed"),
    block_tokens: int = typer.Option(0, help="tokens a cache block (default 16 for llama, 32 "
                                     "for vllm, whose CPU attention needs a multiple of 32)"),
    prefix_tokens: int = typer.Option(0, help="zipf: tokens of each system prompt and of each "
                                      "context (default 32 for llama, 4 blocks for vllm)"),
    max_tokens: int = typer.Option(4, help="tokens generated a request"),
    threads: int | None = typer.Option(
        None, help="engine threads, at most the cores [default: 2, or the cores if fewer]"),
    calibration: Annotated[Path | None, typer.Option(
        help="predict TTFT saved with this calibration file instead of fitting one")] = None,
    calibration_out: Annotated[Path | None, typer.Option(
        help="write the TTFT model fitted on these runs (for 'cache replay --calibration')",
        callback=output_path)] = None,
    replay_only: bool = typer.Option(False, "--replay-only", help="no engine: the replay's "
                                     "blocks reused per counted request (any length, seconds)"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
    plot: Annotated[Path | None, typer.Option(help="TTFT distribution per policy (needs "
                                              "matplotlib)", callback=output_path)] = None,
) -> None:
    """Run the policies inside llama.cpp or vLLM (SmolLM2-135M, loopback) and measure time to
    first token, hit rate and throughput; the replay's prediction beside each."""
    from canopy.apps.cache.live import load_calibration, run_live
    from canopy.engines.processes import ended_by_signals
    from canopy.engines.workloads import (
        WORKLOADS,
        mooncake_workload,
        word_vocabulary,
        zipf_workload,
    )
    from canopy.llm.local import find_smollm2_gguf
    from canopy.reporting import progress_bar

    if engine not in ("llama", "vllm"):
        raise typer.BadParameter(f"--engine must be llama or vllm, got {engine!r}")
    vllm = engine == "vllm"
    names = _policy_specs(policies, engine=engine, online=vllm,
                          extra=("off", "vllm") if vllm else ("off",))
    if scenario not in ("stationary", "shift"):
        raise typer.BadParameter(f"--scenario must be stationary or shift, got {scenario!r}")
    if workload not in WORKLOADS:
        raise typer.BadParameter(f"--workload must be one of {', '.join(WORKLOADS)}, "
                                 f"got {workload!r}")
    threads = min(2, _cores()) if threads is None else threads
    block_tokens = block_tokens or (32 if vllm else 16)
    prefix_tokens = prefix_tokens or (4 * block_tokens if vllm else 32)
    for name, value, low in (("--requests", requests, 2), ("--repeats", repeats, 1),
                             ("--block-tokens", block_tokens, 1),
                             ("--prefix-tokens", prefix_tokens, 1),
                             ("--max-tokens", max_tokens, 1), ("--threads", threads, 1)):
        if value < low:
            raise typer.BadParameter(f"{name} must be >= {low}, got {value}")
    if threads > _cores():
        raise typer.BadParameter(f"--threads must be at most the {_cores()} cores this "
                                 f"process may use, got {threads}")
    memory_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20
    if not 0 < capacity_mb <= memory_mb:
        raise typer.BadParameter(f"--capacity-mb must be > 0 and at most this machine's "
                                 f"memory ({memory_mb:,.0f} MiB), got {capacity_mb:g}")
    if vllm and block_tokens % 32:
        raise typer.BadParameter(f"--block-tokens must be a multiple of 32 for vLLM's CPU "
                                 f"attention, got {block_tokens}")
    if vllm and not 3 <= blocks <= 1_000_000:
        raise typer.BadParameter(f"--blocks must be in [3, 1000000] (vLLM keeps 2 for itself), "
                                 f"got {blocks}")
    given = None if calibration is None else load_calibration(calibration)
    try:
        model_path = find_smollm2_gguf()
    except RuntimeError as error:
        raise typer.BadParameter(str(error)) from None
    words, vocab = word_vocabulary(model_path)

    def workload_of(s: int):
        if workload == "zipf":
            return zipf_workload(words, requests=requests, scenario=scenario, seed=s,
                                 system_tokens=prefix_tokens, context_tokens=prefix_tokens)
        return mooncake_workload(words, workload, requests=requests, scenario=scenario,
                                 block_tokens=block_tokens, seed=s)

    workload_of(seed)  # bad data fails before any server starts
    if replay_only:
        _replay_only(names, workload_of, seed, repeats, capacity_mb, block_tokens, vocab,
                     as_json, blocks if vllm else None)
        return
    if vllm:
        from canopy.apps.cache.live import token_prompts

        longest = max(len(p) for p in token_prompts(workload_of(seed), vocab))
        need = -(-(longest + max_tokens) // block_tokens)
        if blocks < need + 2:
            raise typer.BadParameter(f"--blocks {blocks} cannot hold one request of "
                                     f"{longest} tokens ({need} blocks of {block_tokens}, "
                                     f"plus 2)")
    total = len(names) * repeats * requests
    with progress_bar("cache live", total, enabled=not as_json) as update, \
            ended_by_signals():
        done = [0]

        def advance(n: int) -> None:
            done[0] += n
            update(done[0], total)

        if vllm:
            out = _run_vllm(names, workload_of, repeats=repeats, seed=seed, blocks=blocks,
                            block_tokens=block_tokens, threads=threads, max_tokens=max_tokens,
                            model_path=model_path, vocab=vocab, calibration=given,
                            progress=advance)
        else:
            out = run_live(names, workload_of, repeats=repeats, seed=seed,
                           capacity_mb=capacity_mb, block_tokens=block_tokens,
                           n_threads=threads, max_tokens=max_tokens, model_path=model_path,
                           vocab=vocab, calibration=given, progress=advance)
    if calibration_out is not None:
        calibration_out.write_text(json.dumps({"calibration": out["calibration"],
                                               "workload": out["workload"]}, indent=2))
    if as_json:
        typer.echo(json.dumps(out))
    else:
        _live_table(out)
    if plot is not None:
        _plot_live(out, plot)
        from canopy.plotting import announce_plot

        announce_plot(plot)


def _run_vllm(names: list[str], workload_of, *, model_path: Path, **options) -> dict:
    from canopy.apps.cache.live import run_live_vllm
    from canopy.engines.vllm_server import VLLMServerError, model_folder, vllm_python

    try:
        python = vllm_python()
    except VLLMServerError as error:
        raise typer.BadParameter(str(error)) from None
    folder, weights = model_folder(model_path, python)
    return run_live_vllm(names, workload_of, folder=folder, weights=weights,
                         n_threads=options.pop("threads"), **options)


def _replay_only(names: list[str], workload_of, seed: int, repeats: int, capacity_mb: float,
                 block_tokens: int, vocab, as_json: bool, pool_blocks: int | None) -> None:
    import numpy as np

    from canopy.apps.cache.live import (
        block_chains,
        predicted_reuse,
        replay_capacity,
        token_prompts,
    )
    from canopy.engines.llama_cache import kv_bytes_per_token
    from canopy.prefix.traces import full_blocks

    if pool_blocks is None:
        blocks = int(capacity_mb * 2**20) // (block_tokens * kv_bytes_per_token(vocab))
    else:
        blocks = replay_capacity(pool_blocks)

    def chains_of(workload):
        if pool_blocks is None:
            return block_chains(workload, vocab, block_tokens)
        return [full_blocks(p, block_tokens) for p in token_prompts(workload, vocab)]

    workloads = [workload_of(seed + r) for r in range(repeats)]
    # llama.cpp starts a server per workload; vLLM serves a policy's workloads one after the
    # other from one server, so its replay runs them back to back
    runs = [[w] for w in workloads] if pool_blocks is None else [workloads]
    out: dict = {"workload": workloads[0].name, "capacity_blocks": blocks, "repeats": repeats,
                 "results": {}}
    for run in runs:
        chains = [c for w in run for c in chains_of(w)]
        cuts = np.cumsum([0] + [len(w.prompts) for w in run])
        for name in names:
            reused = predicted_reuse(chains, "lru" if name == "vllm" else name, blocks)
            out["results"].setdefault(name, []).extend(
                float(reused[a + w.start:b].mean())
                for w, a, b in zip(run, cuts[:-1], cuts[1:], strict=True))
    if as_json:
        typer.echo(json.dumps(out))
        return
    typer.echo(f"{out['workload']}, {blocks} blocks: blocks reused per counted request "
               f"(replay, {repeats} workload(s))")
    for name, values in out["results"].items():
        typer.echo(f"  {name:7s} " + " ".join(f"{v:.3f}" for v in values))


def _live_table(out: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    fit = out["calibration"]
    where = (f"vLLM, {out['pool_blocks']} blocks" if out.get("engine") == "vllm"
             else f"{out['capacity_mb']:g} MiB")
    table = Table(title=f"{out['workload']}, {where} "
                        f"({out['capacity_blocks']} cached blocks of {out['block_tokens']} "
                        f"tokens), {out['repeats']} repeat(s)")
    for column in ("policy", "TTFT p50 s", "TTFT mean s", "hit rate", "req/s", "saved s",
                   "replay saved s", "vs LRU s (95%)"):
        table.add_column(column, justify="right")
    for policy, r in out["results"].items():
        saved = r.get("ttft_saved_s", {}).get("mean")
        table.add_row(policy, f"{r['ttft_p50_s']:.3f}", f"{r['ttft_mean_s']:.3f}",
                      f"{r['hit_rate']:.3f}", f"{r['throughput_rps']:.2f}",
                      "-" if saved is None else f"{saved:.3f}",
                      f"{r['predicted_ttft_saved_s']:.3f}", _versus(r.get("ttft_vs_lru_s")))
    console = Console()
    console.print(table)
    console.print(f"TTFT model ({fit['source']}): {fit['overhead_ms']:.1f} ms + "
                  f"{fit['ms_per_token']:.2f} ms per uncached token "
                  f"(fit on these runs: R^2 {fit['fitted_r2']:.3f})")


def _versus(gain: dict | None) -> str:
    """TTFT gained over LRU, paired by request, with its interval."""
    if gain is None:
        return "-"
    low_high = "" if gain["ci95"] is None else " [{:.4f}, {:.4f}]".format(*gain["ci95"])
    return f"{gain['mean']:.4f}{low_high}"


def _plot_live(out: dict, file: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axis = plt.subplots(figsize=(5.5, 3.6))
    names = list(out["results"])
    for i, (policy, r) in enumerate(out["results"].items()):
        axis.errorbar(i, r["ttft_mean_s"], fmt="o", capsize=4, label=f"{policy} mean")
        axis.plot([i - 0.2, i + 0.2], [r["ttft_p50_s"]] * 2, color="black", lw=1)
    axis.set_xticks(range(len(names)), names)
    axis.set(ylabel="time to first token (s)", ylim=(0, None),
             title=f"{out['workload']}: mean (dot), p50 (bar)")
    fig.tight_layout()
    fig.savefig(file, dpi=120)
    plt.close(fig)


def register(app: typer.Typer) -> None:
    """Add the ``cache`` command group to the ``canopy`` app."""
    app.add_typer(cache_app, name="cache")
