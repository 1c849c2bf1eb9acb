"""``canopy search replay`` (logged MATH answers), ``canopy search run`` (live search on GSM8K
or MATH-500 against an OpenAI-compatible endpoint), ``code`` and ``prior``."""

from __future__ import annotations

import os
from typing import Annotated

import typer
from rich.console import Console

from canopy.apps.search.budget import check_budgets
from canopy.plotting import announce_plot
from canopy.reporting import (
    BaseUrl,
    CacheDir,
    Json,
    Model,
    Plot,
    Reference,
    Seed,
    Timeout,
    cli_error,
    interval_cells,
    output_path,
    plot_accuracy,
    print_json,
    print_table,
    progress_bar,
)

__all__ = ["register", "search_app"]

search_app = typer.Typer(no_args_is_help=True, add_completion=False,
                         help="Test-time search: value-guided search against best-of-N.")

_REPLAY_FILES = {"qwen25math_rm": "math_cot_100.jsonl"}
Offset = Annotated[int, typer.Option("--offset", help="First item.")]
LiveBudgets = Annotated[str, typer.Option("--budgets", help="Comma-separated budgets, in "
                                          "generation calls per item.")]
Methods = Annotated[str, typer.Option("--methods", help="Comma-separated methods.")]
MaxTokens = Annotated[int, typer.Option("--max-tokens", help="Tokens per rollout.")]
Temperature = Annotated[float, typer.Option("--temperature")]
_COLUMNS = ["method", "budget", "accuracy [95% CI]", "delta [95% CI]", "calls",
            "reward_calls", "tokens"]


def parse_budgets(text: str, *, whole: bool = False) -> list[float]:
    """``"2,4,8"`` -> ``[2.0, 4.0, 8.0]``; each must be a number of calls >= 1."""
    try:
        budgets = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"--budgets must be comma-separated numbers, got {text!r}") from None
    return check_budgets(budgets, whole=whole)


@search_app.command("replay")
def replay_command(
    dataset: Annotated[str, typer.Option("--dataset", help="Logged data set.")] = "qwen25math_rm",
    budgets: Annotated[str, typer.Option("--budgets", help="Comma-separated budgets, in "
                                         "model calls per problem.")] = "1,2,4,8,16",
    rm_cost: Annotated[float, typer.Option("--rm-cost", help="Calls charged for one "
                                           "reward-model score.")] = 1.0,
    orders: Annotated[int, typer.Option("--orders", help="Random generation orders per "
                                        "problem.")] = 20,
    seed: Seed = 0,
    reference: Reference = "best_of_n",
    as_json: Json = False,
    plot: Plot = None,
) -> None:
    """Replay best-of-N, majority, reward-weighted vote and the multi-fidelity selector on
    logged answers at matched budgets, with paired bootstrap intervals over problems."""
    from canopy import data
    from canopy.apps.search.replay import load_logged, replay

    try:
        if dataset not in _REPLAY_FILES:
            raise ValueError(f"unknown --dataset {dataset!r}; known: {', '.join(_REPLAY_FILES)}")
        problems = load_logged(data.path(dataset, _REPLAY_FILES[dataset]))
        with progress_bar("replay", len(problems), enabled=not as_json) as update:
            result = replay(problems, budgets=parse_budgets(budgets), rm_cost=rm_cost,
                            n_orders=orders, seed=seed, progress=update)
        rows = [row.as_dict() for row in result.rows(reference=reference, seed=seed)]
    except (ValueError, FileNotFoundError) as error:
        raise cli_error(error) from None
    if plot is not None:
        plot_accuracy(rows, plot, x="calls", title=f"{dataset}: accuracy vs calls",
                      xlabel="model calls per problem (mean spent)")
        announce_plot(plot)
    if as_json:
        print_json({"dataset": dataset, "rm_cost": rm_cost, "orders": orders, "rows": rows})
    else:
        print_table([interval_cells(row) for row in rows], _COLUMNS,
                    title=f"{dataset}: {len(problems)} problems, reward call = {rm_cost:g} "
                    f"calls, delta against {reference}")


_LIVE_COLUMNS = ["method", "budget", "accuracy [95% CI]", "delta [95% CI]", "calls", "tokens"]


def parse_names(text: str, known: tuple[str, ...], option: str) -> list[str]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [name for name in names if name not in known]
    if not names or unknown:
        raise ValueError(f"{option} must list some of {', '.join(known)}; got {text!r}")
    return names


@search_app.command("run")
def run_command(
    task: Annotated[str, typer.Option("--task", help="gsm8k (test questions) or math500 "
                                      "(MATH-500 problems, final answer in \\boxed{}).")
                    ] = "gsm8k",
    base_url: BaseUrl = None,
    model: Model = None,
    n: Annotated[int, typer.Option("--n", help="Questions or problems.")] = 5,
    offset: Offset = 0,
    budgets: LiveBudgets = "4,8",
    methods: Methods = "first,best_of_n,majority,weighted_vote,beam,value_guided",
    max_tokens: MaxTokens = 192,
    temperature: Temperature = 0.8,
    seed: Seed = 0,
    cache_dir: CacheDir = None,
    timeout: Timeout = 120.0,
    reference: Reference = "best_of_n",
    as_json: Json = False,
    plot: Plot = None,
) -> None:
    """Value-guided search against best-of-N (first, highest likelihood, majority, weighted
    vote) and beam search on GSM8K or MATH-500 at matched generation calls, live; with the
    share of questions where a best-of-N rollout is right (reachable)."""
    from canopy.apps.search.live import LIVE_METHODS, SearchConfig, run_search
    from canopy.apps.search.tasks import get_task
    from canopy.llm.local import LocalServerError, open_endpoint

    console = Console(stderr=True)
    try:
        chosen = parse_names(methods, LIVE_METHODS, "--methods")
        budget_list = [int(b) for b in parse_budgets(budgets, whole=True)]
        config = SearchConfig(max_tokens=max_tokens, temperature=temperature)
        live_task = get_task(task)
        questions = live_task.load(n, offset)
        with open_endpoint(base_url, model=model, cache_dir=cache_dir, timeout=timeout) as (
                client, server):
            with progress_bar("search", len(questions), enabled=not as_json) as update:
                result = run_search(client, questions, budgets=budget_list, methods=chosen,
                                    config=config, seed=seed, task=live_task,
                                    progress=update)
            usage = client.usage
            requests = server.request_count if server is not None else None
    except (ValueError, FileNotFoundError, LocalServerError) as error:
        raise cli_error(error) from None
    rows = result.rows(reference=reference, seed=seed)
    reach = result.reachability(seed=seed)
    if result.error is not None:
        console.print(f"[yellow]stopped early:[/yellow] {result.error}; "
                      f"{result.completed} of {result.n_questions} questions kept")
    if plot is not None and rows:
        plot_accuracy(rows, plot, x="budget", title=f"{live_task.label}: accuracy vs budget",
                      xlabel="generation calls per question")
        announce_plot(plot)
    meta = {"task": live_task.name, "questions": result.completed, "requested": result.n_questions,
            "error": result.error, "http_calls": usage.calls, "cache_hits": usage.cache_hits,
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens, "server_requests": requests}
    if as_json:
        print_json({**meta, "rows": rows, "reachable": reach})
    else:
        print_table([interval_cells(row) for row in rows], _LIVE_COLUMNS,
                    title=f"{live_task.label}: {result.completed} questions, delta against "
                          f"{reference}")
        if reach:
            Console().print("reachable (a best-of-N rollout is right): " + ", ".join(
                f"budget {r['budget']} {r['reachable']:.3f} [{r['ci_low']:.3f}, "
                f"{r['ci_high']:.3f}]" for r in reach))
        Console().print(f"HTTP calls {usage.calls}, cache hits {usage.cache_hits}, "
                        f"tokens {usage.prompt_tokens} prompt + {usage.completion_tokens} "
                        f"completion" + (f", server requests {requests}" if requests is not None
                                         else ""))
    if result.error is not None:
        raise typer.Exit(1)


@search_app.command("code")
def code_command(
    dataset: Annotated[str, typer.Option("--dataset", help="humaneval, mbpp or arith:trivial|"
                                         "easy|medium|hard (generated).")] = "mbpp",
    base_url: BaseUrl = None,
    model: Model = None,
    n: Annotated[int, typer.Option("--n", help="Tasks.")] = 5,
    offset: Offset = 0,
    budgets: LiveBudgets = "4,8",
    methods: Methods = "first,best_of_n,majority,value_guided",
    max_tokens: MaxTokens = 256,
    temperature: Temperature = 0.8,
    branching: Annotated[int, typer.Option("--branching", help="value_guided: distinct next "
                                           "lines per prefix.")] = 4,
    depth: Annotated[int, typer.Option("--depth", help="value_guided: program lines at the "
                                       "tree's leaves.")] = 2,
    seed: Seed = 0,
    cache_dir: CacheDir = None,
    timeout: Timeout = 120.0,
    reference: Reference = "best_of_n",
    allow_unisolated: Annotated[bool, typer.Option(
        "--allow-unisolated", help="Run generated programs as yourself when neither "
        "bubblewrap nor root isolation works here (otherwise refused).")] = False,
    as_json: Json = False,
) -> None:
    """Code search with an execution probe (partial tests) against best-of-N and majority
    by output at matched generation calls, graded by all tests; pass@k as reachability."""
    from canopy.apps.search.code import load_code_tasks
    from canopy.apps.search.codesearch import CODE_METHODS, run_code_search
    from canopy.apps.search.live import SearchConfig
    from canopy.apps.search.sandbox import ENV_ISOLATION, isolation
    from canopy.llm.local import LocalServerError, open_endpoint

    if allow_unisolated:
        os.environ[ENV_ISOLATION] = "none"
    try:
        isolation()  # refuse before any call when generated code cannot be contained
        chosen = parse_names(methods, CODE_METHODS, "--methods")
        budget_list = [int(b) for b in parse_budgets(budgets, whole=True)]
        config = SearchConfig(max_tokens=max_tokens, temperature=temperature,
                              branching=branching, max_depth=depth)
        tasks = load_code_tasks(dataset, n=n, offset=offset)
        with open_endpoint(base_url, model=model, cache_dir=cache_dir, timeout=timeout) as (
                client, _), progress_bar("code search", len(tasks),
                                         enabled=not as_json) as update:
            result, reach = run_code_search(client, tasks, budgets=budget_list,
                                            methods=chosen, config=config, seed=seed,
                                            progress=update)
    except (ValueError, FileNotFoundError, LocalServerError) as error:
        raise cli_error(error) from None
    rows = result.rows(reference=reference, seed=seed)
    if result.error is not None:
        Console(stderr=True).print(f"[yellow]stopped early:[/yellow] {result.error}; "
                                   f"{result.completed} of {result.n_questions} tasks kept")
    if as_json:
        print_json({"dataset": dataset, "tasks": result.completed, "error": result.error,
                    "reachability": reach, "rows": rows})
    else:
        print_table([interval_cells(row) for row in rows], _LIVE_COLUMNS,
                    title=f"{dataset}: {result.completed} tasks, pass (all tests), delta "
                          f"against {reference}")
        Console().print("reachability of the best-of-N samples: " + ", ".join(
            f"{k} {v:.3f}" for k, v in reach.items()))
    if result.error is not None:
        raise typer.Exit(1)


@search_app.command("prior")
def prior_command(
    dataset: Annotated[str, typer.Option("--dataset", help="gsm8k, bbh:TASK, humaneval, mbpp "
                                         "or arith:trivial|easy|medium|hard.")] = "gsm8k",
    from_log: Annotated[str | None, typer.Option("--from-log", help="Analyse this log "
                                                 "(JSONL) instead of running.")] = None,
    log: Annotated[str | None, typer.Option("--log", callback=output_path,
                                            help="Write the run's log here "
                                            "(JSONL: tree, node, parent, depth, probe, "
                                            "truth).")] = None,
    base_url: BaseUrl = None,
    model: Model = None,
    n: Annotated[int, typer.Option("--n", help="Questions or tasks.")] = 5,
    offset: Offset = 0,
    branching: Annotated[int, typer.Option("--branching", help="Next lines per node.")] = 3,
    depth: Annotated[int, typer.Option("--depth", help="Levels below the root.")] = 2,
    rollouts: Annotated[int, typer.Option("--rollouts", help="Rollouts per node.")] = 2,
    max_tokens: MaxTokens = 192,
    temperature: Temperature = 0.8,
    seed: Seed = 0,
    cache_dir: CacheDir = None,
    timeout: Timeout = 120.0,
    as_json: Json = False,
) -> None:
    """Measure the prior: probe-vs-truth correlation, edge-following hit rate (all and
    pivotal steps), value lost per step and the pivotal-step fraction (paper
    Table 7), from a live run over a fully expanded prefix tree or from a log."""
    from canopy.apps.search.prior import analyse, log_prior, prior_items, read_log, write_log
    from canopy.llm.client import LLMError
    from canopy.llm.local import LocalServerError, open_endpoint

    try:
        if from_log is not None:
            rows = read_log(from_log)
        else:
            items = prior_items(dataset, n=n, offset=offset)
            config = {"branching": branching, "depth": depth, "rollouts": rollouts,
                      "max_tokens": max_tokens, "temperature": temperature, "seed": seed}
            with open_endpoint(base_url, model=model, cache_dir=cache_dir,
                               timeout=timeout) as (client, _), \
                    progress_bar("prior trees", len(items), enabled=not as_json) as update:
                rows = log_prior(client, dataset, items, progress=update, **config)
            if log is not None:
                write_log(rows, log)
        result = analyse(rows)
    except (ValueError, FileNotFoundError, LocalServerError) as error:
        raise cli_error(error) from None
    except LLMError as error:  # the endpoint failed mid-run: one line, as `search run` does
        Console(stderr=True, soft_wrap=True).print(f"[red]error:[/red] {error}")
        raise typer.Exit(1) from None
    if as_json:
        print_json(result)
        return
    table = [{"quantity": "probe-vs-truth Spearman", "value": result["spearman"]},
             {"quantity": "probe-vs-truth Pearson", "value": result["pearson"]},
             {"quantity": f"hit rate, all {result['steps']} steps (chance "
                          f"{result['hit_rate_chance'] or 0:.2f})", "value": result["hit_rate"]},
             {"quantity": "true value lost per step", "value": result["value_lost_per_step"]}]
    for tau, entry in result["pivotal"].items():
        table.append({"quantity": f"pivotal fraction, tau {tau}", "value": entry["fraction"]})
        if entry.get("hit_rate") is not None:
            low, high = entry["hit_rate_ci"]
            table.append({"quantity": f"hit rate on {entry['steps']} pivotal steps, tau {tau} "
                                      f"[{low:.2f}, {high:.2f}] (chance {entry['chance']:.2f})",
                          "value": entry["hit_rate"]})
    print_table(table, ["quantity", "value"], title=f"the prior: {result['trees']} trees, "
                f"{result['nodes']} nodes, {result['rows']} rollouts")


def register(app: typer.Typer) -> None:
    """Add the ``search`` command group."""
    app.add_typer(search_app, name="search")
