"""Refuse, at start-up, a draft whose tokenizer or vocabulary differs from the target's.

Speculative decoding is only lossless when draft token ids mean the same strings as the target's.
vLLM itself only compares vocabulary *sizes*; two tokenizers of equal size but different merges
would silently produce garbage drafts (zero acceptance) or, worse, look fine on some prompts.
We compare a fingerprint of the full vocabulary (token -> id, added/special tokens) and the
configured vocab size. Pure file reading; no transformers import when ``tokenizer.json`` exists.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path


class DraftPairMismatch(ValueError):
    pass


@dataclass(frozen=True)
class VocabFingerprint:
    vocab_size: int | None  # config.json's vocab_size (embedding rows)
    num_tokens: int  # tokens in the tokenizer vocabulary (added tokens included)
    digest: str  # sha256 over sorted (token, id) pairs


def _tokenizer_vocab(model_dir: Path) -> dict[str, int]:
    tj = model_dir / "tokenizer.json"
    if tj.is_file():
        data = json.loads(tj.read_text())
        model = data.get("model", {})
        vocab = model.get("vocab")
        if isinstance(vocab, list):  # unigram: [[piece, score], ...]
            vocab = {piece[0]: i for i, piece in enumerate(vocab)}
        vocab = dict(vocab or {})
        for tok in data.get("added_tokens", []):
            vocab[tok["content"]] = tok["id"]
        if vocab:
            return vocab
    from transformers import AutoTokenizer  # slow path: sentencepiece-only folders

    return dict(AutoTokenizer.from_pretrained(str(model_dir)).get_vocab())


def fingerprint(model_dir: str | os.PathLike[str]) -> VocabFingerprint:
    d = Path(model_dir)
    vocab_size = None
    cfg = d / "config.json"
    if cfg.is_file():
        c = json.loads(cfg.read_text())
        vocab_size = c.get("vocab_size") or c.get("text_config", {}).get("vocab_size")
    vocab = _tokenizer_vocab(d)
    h = hashlib.sha256()
    for tok, idx in sorted(vocab.items(), key=lambda kv: (kv[1], kv[0])):
        h.update(f"{idx}\t{tok}\n".encode())
    return VocabFingerprint(vocab_size=vocab_size, num_tokens=len(vocab), digest=h.hexdigest())


def check_pair(target: str | os.PathLike[str], draft: str | os.PathLike[str]) -> None:
    """Raise ``DraftPairMismatch`` (naming both models) if the draft cannot draft for the target."""
    t, d = fingerprint(target), fingerprint(draft)
    problems = []
    if t.vocab_size is not None and d.vocab_size is not None and t.vocab_size != d.vocab_size:
        problems.append(f"vocab_size {t.vocab_size} (target) != {d.vocab_size} (draft)")
    if t.digest != d.digest:
        problems.append(
            f"tokenizer vocabularies differ ({t.num_tokens} tokens, sha256 {t.digest[:12]} (target) vs "
            f"{d.num_tokens} tokens, sha256 {d.digest[:12]} (draft))"
        )
    if problems:
        raise DraftPairMismatch(
            f"speculative_config: draft model {os.fspath(draft)!r} cannot draft for target model "
            f"{os.fspath(target)!r}: " + "; ".join(problems) + ". Use a draft with the target's tokenizer."
        )


# What the pair check reads of a Hub model: vLLM downloads the target's tokenizer and both configs,
# not the draft's tokenizer, so the check fetches these few small files itself.
PAIR_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
              "added_tokens.json", "vocab.json", "merges.txt", "tokenizer.model")


def model_files(model: str, revision: str | None = None, cache_dir: str | None = None) -> str:
    """A folder holding ``model``'s config and tokenizer: ``model`` itself if it is a folder, else its
    snapshot in the Hugging Face cache (vLLM's download dir), fetching ``PAIR_FILES`` that are missing
    (``HF_HUB_OFFLINE`` and ``HF_TOKEN`` apply as they do to vLLM)."""
    if os.path.isdir(model):
        return model
    from huggingface_hub import snapshot_download

    return snapshot_download(repo_id=model, revision=revision, cache_dir=cache_dir, allow_patterns=list(PAIR_FILES))


def check_model_pair(target: str, draft: str, *, target_revision: str | None = None,
                     draft_revision: str | None = None, cache_dir: str | None = None) -> None:
    """``check_pair`` for folders or Hub repo ids (after vLLM has downloaded them). A pair whose files
    cannot be read raises ``DraftPairMismatch`` too: a worker that cannot check its pair says so."""
    try:
        t = model_files(target, target_revision, cache_dir)
        d = model_files(draft, draft_revision, cache_dir)
    except Exception as e:  # noqa: BLE001 - huggingface_hub raises several unrelated types
        raise DraftPairMismatch(
            f"speculative_config: cannot read the tokenizers of target model {target!r} and draft model {draft!r} "
            f"to compare them: {type(e).__name__}: {e}"
        ) from e
    try:
        check_pair(t, d)
    except DraftPairMismatch as e:  # name the models as the user gave them, not their cache folders
        raise DraftPairMismatch(str(e).replace(repr(d), repr(draft)).replace(repr(t), repr(target))) from None
