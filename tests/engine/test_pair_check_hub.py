"""The pair check for Hub models (the GPU sample's case): the worker reads both models' tokenizers
from vLLM's download cache (huggingface_hub's own layout and resolution, offline here) and refuses a
mismatch naming the two models as the user gave them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from nightjar_worker.engine.pair_check import DraftPairMismatch, check_model_pair


def hub_model(cache: Path, repo: str, vocab: dict[str, int], vocab_size: int) -> None:
    """``repo`` as huggingface_hub caches it: refs/main -> snapshots/<commit>/ (config and tokenizer)."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    root = cache / ("models--" + repo.replace("/", "--"))
    snap = root / "snapshots" / commit
    snap.mkdir(parents=True)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(commit)
    (snap / "config.json").write_text(json.dumps({"model_type": "qwen3", "vocab_size": vocab_size}))
    (snap / "tokenizer.json").write_text(json.dumps({"model": {"type": "BPE", "vocab": vocab}, "added_tokens": []}))


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub.constants as hc

    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", True)  # no hub here: the cache is what vLLM downloaded


VOCAB = {"a": 0, "b": 1, "ab": 2}


def test_a_hub_pair_with_one_tokenizer_passes(tmp_path: Path, offline: None):
    hub_model(tmp_path, "Org/Target-8B", VOCAB, 8)
    hub_model(tmp_path, "Org/Draft-0.6B", VOCAB, 8)
    check_model_pair("Org/Target-8B", "Org/Draft-0.6B", cache_dir=str(tmp_path))


def test_a_hub_pair_with_different_tokenizers_is_refused_naming_both(tmp_path: Path, offline: None):
    hub_model(tmp_path, "Org/Target-8B", VOCAB, 8)
    hub_model(tmp_path, "Org/Other-0.5B", {**VOCAB, "ba": 3}, 8)
    with pytest.raises(DraftPairMismatch) as e:
        check_model_pair("Org/Target-8B", "Org/Other-0.5B", cache_dir=str(tmp_path))
    msg = str(e.value)
    assert "'Org/Other-0.5B' cannot draft for target model 'Org/Target-8B'" in msg
    assert "tokenizer vocabularies differ" in msg and str(tmp_path) not in msg


def test_a_pair_whose_files_cannot_be_read_is_refused_naming_both(tmp_path: Path, offline: None):
    hub_model(tmp_path, "Org/Target-8B", VOCAB, 8)
    with pytest.raises(DraftPairMismatch, match="cannot read the tokenizers of target model 'Org/Target-8B' and draft model 'Org/Missing'"):
        check_model_pair("Org/Target-8B", "Org/Missing", cache_dir=str(tmp_path))
