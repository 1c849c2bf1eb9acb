"""Draw docs/figures/architecture.png, the map of docs/architecture.md: the layers of the
package, the cache's one block tree under its five hosts, and the routing service's flow.

Run from the repository root: ``python docs/figures/architecture.py`` (needs matplotlib)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

OUT = Path(__file__).with_suffix(".png")
INK, MUTED = "#1f2933", "#52606d"
FILL = {"entry": "#e4e7eb", "integrations": "#fde2c8", "apps": "#d9eaf7", "shared": "#d5f0dd",
        "core": "#efe3f7", "llm": "#f7f3d4"}


def box(ax, x, y, w, h, title, body="", fill="#ffffff", size=10):
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.004,rounding_size=0.012",
                                facecolor=fill, edgecolor=INK, linewidth=1.0))
    ax.text(x + w / 2, y + h - 0.012, title, ha="center", va="top", fontsize=size,
            fontweight="bold", color=INK)
    if body:
        ax.text(x + w / 2, y + h / 2 - 0.014, body, ha="center", va="center",
                fontsize=size - 2, color=MUTED, linespacing=1.35)


def arrow(ax, start, end, text="", both=False, style="-|>"):
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle="<|-|>" if both else style,
                                 mutation_scale=12, color=INK, linewidth=1.1,
                                 shrinkA=2, shrinkB=2))
    if text:
        ax.text((start[0] + end[0]) / 2 + 0.005, (start[1] + end[1]) / 2, text, fontsize=8,
                color=MUTED, va="center", ha="left")


def layers(ax):
    ax.text(0.0, 0.985, "a. Layers: each imports only the ones below it", fontsize=12,
            fontweight="bold", color=INK, va="top")
    rows = [
        ("entry", "entry points", "the canopy command line (cli, commands)\n"
         "experiments/: the paper's studies, their runner and outputs"),
        ("integrations", "integrations/", "LiteLLM routing strategy · vLLM eviction plugin\n"
         "SGLang eviction strategy · llama-cpp server · Ray Tune searcher"),
        ("apps", "apps/", "cache · routing (proxy) · fleet · topk · search · trim\n"
         "each adapts a shared core to one use; apps never import each other"),
        ("shared", "shared cores", ""),
        ("core", "core", "tree · problem · stats · certificate · certified_tree · policies\n"
         "validation (argument checks) · errors · data (the data registry)"),
    ]
    top, gap = 0.93, 0.04
    heights = [0.12, 0.12, 0.12, 0.20, 0.12]
    ys = []
    for i, (kind, title, body) in enumerate(rows):
        height = heights[i]
        y = top - sum(heights[:i + 1]) - i * gap
        ys.append(y)
        box(ax, 0.0, y, 0.80, height, title, body, FILL[kind], size=11)
        if kind == "shared":
            for j, (name, text) in enumerate([
                    ("canopy.prefix", "the block tree the cache\nhosts share: tables, radix\n"
                     "kernels, eviction-policy\nprotocol, Mooncake traces,\nTTFT model"),
                    ("canopy.regional", "region trees, regional\nbandit, routing service:\n"
                     "route() / outcome() own\nthe decision; ledger over\na store"),
                    ("canopy.fleet", "replica index (on the\nblock tree), load,\n"
                     "replica policies")]):
                box(ax, 0.02 + j * 0.26, y + 0.01, 0.24, height - 0.05, name, text,
                    "#ffffff", size=9)
        if i:
            arrow(ax, (0.40, y + height + gap), (0.40, y + height), "imports")
    box(ax, 0.84, ys[3], 0.16, ys[1] + heights[1] - ys[3], "llm/",
        "an OpenAI-\ncompatible client\nwith a response\ncache; a local\nllama.cpp server\n\n"
        "used by search,\ntrim, routing\nand studies", FILL["llm"], size=10)
    arrow(ax, (0.80, ys[2] + heights[2] / 2), (0.84, ys[2] + heights[2] / 2))
    arrow(ax, (0.92, ys[3]), (0.80, ys[4] + heights[4] / 2))


def cache(ax):
    ax.text(0.0, 0.985, "b. The cache: one block tree, five hosts", fontsize=12,
            fontweight="bold", color=INK, va="top")
    hosts = [("replay", "a trace, offline:\nper-request reuse"),
             ("streaming", "requests as they\ncome, bounded\nmemory"),
             ("llama.cpp", "a live server's\nslots"),
             ("vLLM", "the plugin in\nvLLM's KV-cache\nmanager"),
             ("SGLang", "the strategy in\nSGLang's\nRadixCache")]
    width = 0.185
    for i, (name, text) in enumerate(hosts):
        x = i * (width + 0.0125)
        box(ax, x, 0.52, width, 0.34, name, text, FILL["apps" if i < 3 else "integrations"])
        arrow(ax, (x + width / 2, 0.52), (x + width / 2, 0.40))
    box(ax, 0.0, 0.06, 1.0, 0.34, "canopy.prefix: the state each host holds",
        "one block table (grow, remap after forgetting) and the radix kernels over it;\n"
        "the eviction policy hands out victims among evictable blocks (pop_victim), batched;\n"
        "a host keeps only the map from its engine's block to the policy's key",
        FILL["shared"], size=11)


def routing(ax):
    ax.text(0.0, 0.985, "c. Routing: the service decides, adapters translate", fontsize=12,
            fontweight="bold", color=INK, va="top")
    chain = [("HTTP proxy\nLiteLLM", "translate a\nrequest and its\nrating", "apps"),
             ("RoutingService", "route() -> region,\nranking\noutcome(model, ok)", "shared"),
             ("FeedbackLedger", "a call accepts one\nrating in its window;\nerrors as types",
              "shared"),
             ("Store", "memory · SQLite ·\nRedis, shared by\nevery worker", "shared")]
    width = 0.22
    for i, (name, text, kind) in enumerate(chain):
        x = i * (width + 0.04)
        box(ax, x, 0.45, width, 0.42, name, text, FILL[kind], size=10)
        if i:
            arrow(ax, (x - 0.04, 0.66), (x, 0.66))
    ax.text(0.5, 0.22, "sync", ha="center", fontsize=10, fontweight="bold", color=INK)
    ax.add_patch(FancyArrowPatch((3 * (width + 0.04) + width / 2, 0.45),
                                 (width + 0.04 + width / 2, 0.45),
                                 connectionstyle="arc3,rad=-0.45", arrowstyle="-|>",
                                 mutation_scale=12, color=INK, linewidth=1.1))
    ax.text(0.5, 0.06, "sync: every 0.25 s the service pulls the cells any worker changed\n"
            "into its router, so every worker ranks with every worker's ratings",
            ha="center", va="bottom", fontsize=9, color=MUTED)


def main() -> None:
    fig = plt.figure(figsize=(15, 9.6))
    grid = fig.add_gridspec(2, 2, width_ratios=[1.05, 1.0], height_ratios=[1, 1],
                            left=0.02, right=0.98, top=0.97, bottom=0.02, wspace=0.06,
                            hspace=0.10)
    for spec, draw in ((grid[:, 0], layers), (grid[0, 1], cache), (grid[1, 1], routing)):
        ax = fig.add_subplot(spec)
        ax.set_xlim(-0.01, 1.01)
        ax.set_ylim(0, 1)
        ax.axis("off")
        draw(ax)
    fig.savefig(OUT, dpi=100, metadata={"Software": None})
    print(OUT)


if __name__ == "__main__":
    main()
