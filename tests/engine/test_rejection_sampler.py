"""The rejection-sampling guarantee of vLLM's CPU rejection sampler, tested directly.

End to end, temperature > 0 with a draft model is broken on vLLM's CPU backend (acceptance 0-6% even
with the target as its own draft; see docs/engine.md), so the sampling path is checked where the
guarantee lives: ``vllm.v1.sample.rejection_sampler.rejection_sample`` on a small vocabulary. For
drafts x ~ q and target p, the emitted token at each position must be distributed as p whatever q is
(Leviathan et al. 2023). Chi-square goodness of fit with fixed seeds; the test fails if the sampler
returned the draft (q) or any other distribution.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

rs = pytest.importorskip("vllm.v1.sample.rejection_sampler")

VOCAB = 6
N = 10000


@pytest.fixture(scope="module", autouse=True)
def _cpu_kernels() -> None:
    # What the CPU worker does at start-up: the sampler's Triton kernels get their C++ fallbacks.
    from vllm.platforms import current_platform
    from vllm.triton_utils import dispatcher

    # An engine built earlier in this process registered them already; registering again rescans
    # sys.modules, which trips over llvmlite's lazy function table once numba is imported (the
    # n-gram proposer imports it).
    if getattr(dispatcher, "_registry", None):
        return
    if hasattr(current_platform, "import_kernels"):
        current_platform.import_kernels()
    if hasattr(current_platform, "register_triton_kernel_overrides"):
        current_platform.register_triton_kernel_overrides()


def _metadata(n: int):
    from vllm.v1.sample.metadata import SamplingMetadata

    return SamplingMetadata(
        temperature=torch.ones(n, dtype=torch.float32),
        all_greedy=False,
        all_random=True,
        top_p=None,
        top_k=None,
        generators={},
        max_num_logprobs=None,
        no_penalties=True,
        prompt_token_ids=None,
        frequency_penalties=torch.zeros(n),
        presence_penalties=torch.zeros(n),
        repetition_penalties=torch.ones(n),
        output_token_ids=[[] for _ in range(n)],
        allowed_token_ids_mask=None,
        bad_words_token_ids={},
        logitsprocs=None,
    )


def _chi2_p(counts: np.ndarray, probs: np.ndarray) -> float:
    from math import exp, lgamma, log

    exp_c = probs * counts.sum()
    stat = float(((counts - exp_c) ** 2 / exp_c).sum())
    k = len(counts) - 1
    # survival function of chi2(k) via the regularised upper incomplete gamma (series; k small)
    a, x = k / 2.0, stat / 2.0
    if x == 0:
        return 1.0
    term = s = 1.0 / a
    for n in range(1, 500):
        term *= x / (a + n)
        s += term
    lower = exp(-x + a * log(x) - lgamma(a)) * s
    return max(0.0, 1.0 - lower)


@pytest.mark.parametrize("spec_len", [1, 2])
def test_emitted_tokens_follow_target_distribution(spec_len: int) -> None:
    g = torch.Generator().manual_seed(1234 + spec_len)
    torch.manual_seed(99 + spec_len)
    p = torch.tensor([0.35, 0.25, 0.15, 0.12, 0.08, 0.05])
    q = torch.tensor([0.05, 0.10, 0.40, 0.05, 0.30, 0.10])  # a bad draft: far from p
    num_tokens = N * spec_len
    draft = torch.multinomial(q, num_tokens, replacement=True, generator=g).to(torch.int32)
    draft_probs = q.repeat(num_tokens, 1).contiguous()
    target_logits = p.log().repeat(num_tokens, 1).contiguous()
    bonus = torch.multinomial(p, N, replacement=True, generator=g).to(torch.int32).view(N, 1)
    cu = torch.arange(1, N + 1, dtype=torch.int32) * spec_len
    out = rs.rejection_sample(
        draft.contiguous(), [spec_len] * N, spec_len, cu, draft_probs, target_logits,
        bonus.contiguous(), _metadata(N),
    )
    assert out.shape == (N, spec_len + 1)
    first = out[:, 0].numpy()
    assert (first >= 0).all() and (first < VOCAB).all()
    counts = np.bincount(first, minlength=VOCAB).astype(float)
    pv = _chi2_p(counts, p.numpy())
    assert pv > 1e-3, f"first emitted token is not distributed as the target p: counts={counts}, p-value={pv:.2e}"
    # and it is clearly not the draft distribution
    assert _chi2_p(counts, q.numpy()) < 1e-12
    acc = (out[:, 1] != rs.PLACEHOLDER_TOKEN_ID).float().mean().item() if spec_len >= 1 else 0.0
    expected_acc = float(torch.minimum(p, q).sum())  # P(accept draft 1) = sum_x min(p, q)
    assert abs(acc - expected_acc) < 0.02, (acc, expected_acc)
    if spec_len == 2:  # second position (given the first draft was accepted) is also ~ p
        sel = out[:, 1] != rs.PLACEHOLDER_TOKEN_ID
        second = out[sel, 1].numpy()
        c2 = np.bincount(second, minlength=VOCAB).astype(float)
        assert _chi2_p(c2, p.numpy()) > 1e-3, c2
