"""The default price table (data only; see :mod:`canopy.apps.routing.prices`).

Bump ``version`` whenever a price changes.
"""

PRICE_TABLE = {
    "version": "2024.06-1",
    "unit": "USD per 1M tokens",
    "source": (
        "Approximate public list prices as of mid-2024. Hosted APIs (OpenAI, Anthropic, Google): "
        "the vendor’s list price for that model version. Open-weights models: the size tier of a "
        "hosted serving price list (Together AI, 2024): <=4B 0.10, <=8B 0.20, <=21B 0.30, <=41B "
        "0.80, <=80B 0.90, Mixtral-8x7B 0.60. A price for routing experiments, not a quote."
    ),
    "models": {
        "gpt-4-1106-preview": {"input": 10.0, "output": 30.0},
        "gpt4_1106_preview": {"input": 10.0, "output": 30.0},
        "gpt4_turbo": {"input": 10.0, "output": 30.0},
        "gpt4_gamed": {"input": 10.0, "output": 30.0},
        "gpt-4-0314": {"input": 30.0, "output": 60.0},
        "gpt4_0613_concise": {"input": 30.0, "output": 60.0},
        "gpt-3.5-turbo": {"input": 1.5, "output": 2.0},
        "gpt-3.5-turbo-0301": {"input": 2.0, "output": 2.0},
        "chatgpt": {"input": 2.0, "output": 2.0},
        "gpt-3.5-turbo-1106": {"input": 1.0, "output": 2.0},
        "gpt-3.5-turbo-1106_concise": {"input": 1.0, "output": 2.0},
        "gpt-3.5-turbo-1106_verbose": {"input": 1.0, "output": 2.0},
        "gpt35_turbo_instruct": {"input": 1.5, "output": 2.0},
        "text_davinci_003": {"input": 20.0, "output": 20.0},
        "text_davinci_001": {"input": 20.0, "output": 20.0},
        "claude": {"input": 8.0, "output": 24.0},
        "claude-1": {"input": 8.0, "output": 24.0},
        "claude-2": {"input": 8.0, "output": 24.0},
        "claude-2.1": {"input": 8.0, "output": 24.0},
        "claude-2.1_concise": {"input": 8.0, "output": 24.0},
        "claude-instant-1": {"input": 1.63, "output": 5.51},
        "claude-instant-1.2": {"input": 0.8, "output": 2.4},
        "palm-2-chat-bison-001": {"input": 0.5, "output": 0.5},
        "mistralai/Mixtral-8x7B-Instruct-v0.1": {"input": 0.6, "output": 0.6},
        "Mixtral-8x7B-Instruct-v0.1_concise": {"input": 0.6, "output": 0.6},
        "mistralai/Mistral-7B-Instruct-v0.1": {"input": 0.2, "output": 0.2},
        "OpenHermes-2.5-Mistral-7B": {"input": 0.2, "output": 0.2},
        "openchat_3.5": {"input": 0.2, "output": 0.2},
        "Starling-LM-7B-alpha": {"input": 0.2, "output": 0.2},
        "Llama-2-70b-chat": {"input": 0.9, "output": 0.9},
        "llama-2-13b-chat-hf": {"input": 0.3, "output": 0.3},
        "llama-2-7b-chat-hf": {"input": 0.2, "output": 0.2},
        "vicuna-33b-v1.3": {"input": 0.8, "output": 0.8},
        "vicuna-13b": {"input": 0.3, "output": 0.3},
        "vicuna-13b-v1.5": {"input": 0.3, "output": 0.3},
        "vicuna-7b": {"input": 0.2, "output": 0.2},
        "vicuna-7b-v1.5": {"input": 0.2, "output": 0.2},
        "Qwen-14B-Chat": {"input": 0.3, "output": 0.3},
        "gemma-7b-it": {"input": 0.2, "output": 0.2},
        "gemma-2b-it": {"input": 0.1, "output": 0.1},
        "phi-2": {"input": 0.1, "output": 0.1},
        "wizardlm-13b": {"input": 0.3, "output": 0.3},
        "falcon-40b-instruct": {"input": 0.8, "output": 0.8},
        "falcon-7b-instruct": {"input": 0.2, "output": 0.2},
        "alpaca-7b": {"input": 0.2, "output": 0.2},
    },
}
