"""A sampled draft's noise keyed by request (vllm_sparrow/drafting/noise.py): a request's draw
depends on its seed, its position and the vocabulary column only, not on the rows beside it, their
order or the chunk it is hashed in; it is Exp(1) noise (Kolmogorov-Smirnov, no correlation between
neighbouring positions, columns or seeds); and the exponential race over it draws from q. The
engine-level checks: seeded requests' output repeats with probabilistic drafts
(test_request_parameters_behave_as_without_sparrow.py, on vLLM 0.34:
test_v2_runner_request_parameters_behave_as_without_sparrow.py), and seeded samples follow the
target's distribution (test_sampling_distribution_matches_target.py)."""

import torch
from support.distribution_checks import chi2_critical, chi2_goodness_of_fit

from vllm_sparrow.drafting.noise import RequestNoise
from vllm_sparrow.drafting.sampling import HeldQ, Sampled
from vllm_sparrow_kernels.request_noise_ref import ROWS_PER_CHUNK

VOCAB = 97


def _noise(seeds, positions, step=0, vocab=VOCAB):
    return RequestNoise(torch.tensor(seeds), torch.tensor(positions)).exponential(torch.empty(len(seeds), vocab), step)


def test_a_requests_noise_depends_on_its_seed_and_position_only():
    seeds = [7, 2**40 + 3, -5, 123456789012345, *range(100, 100 + 2 * ROWS_PER_CHUNK)]  # rows over 3 chunks
    positions = [10, 10, 0, 99_999, *range(2 * ROWS_PER_CHUNK)]
    batch = _noise(seeds, positions)
    assert torch.equal(batch[0], _noise(seeds[:1], positions[:1])[0])  # alone
    order = torch.randperm(len(seeds), generator=torch.Generator().manual_seed(0)).tolist()
    shuffled = _noise([seeds[i] for i in order], [positions[i] for i in order])
    assert torch.equal(shuffled, batch[order])  # another order, other chunks
    assert torch.equal(_noise(seeds[:4], [p - 1 for p in positions[:4]], step=1), batch[:4])  # position + step
    assert not torch.equal(batch[0], batch[1])  # seeds differ (same position)
    assert not torch.equal(batch[0], _noise([7], [11])[0])  # positions differ
    assert not torch.equal(batch[1], _noise([3], [10])[0])  # the seed's high bits count


def test_the_noise_is_exponential_and_uncorrelated():
    n = 2048
    seeds, positions = list(range(n)), [5] * n
    e = _noise(seeds, positions, vocab=128)  # [n, 128]
    u = (1 - torch.exp(-e.double())).flatten().sort().values  # Exp(1) -> U(0, 1)
    grid = (torch.arange(u.numel(), dtype=torch.float64) + 0.5) / u.numel()
    ks = (u - grid).abs().max().item()
    assert ks < 1.63 / u.numel() ** 0.5, f"KS {ks:.5f}"  # alpha = 0.01
    assert abs(e.mean().item() - 1) < 0.01 and abs(e.var().item() - 1) < 0.02
    next_position = _noise(seeds, [6] * n, vocab=128)

    def corr(a, b):
        return torch.corrcoef(torch.stack([a.flatten(), b.flatten()]))[0, 1].abs().item()

    bound = 4 / (n * 127) ** 0.5
    assert corr(e, next_position) < bound and corr(e[:, 1:], e[:, :-1]) < bound and corr(e[1:], e[:-1]) < bound


def test_the_race_over_request_noise_draws_from_q():
    """20,000 requests (seeds), one position each, drafting from the same logits: the tokens'
    counts follow q = softmax(logits / T); a greedy row still drafts its argmax."""
    n = 20_000
    logits = torch.randn(1, 12, generator=torch.Generator().manual_seed(1)) * 2
    temps = torch.full((n,), 0.7)
    temps[-1] = 0.0
    noise = RequestNoise(torch.arange(n) * 7919, torch.full((n,), 3))
    ids, q = Sampled(temps, noise, HeldQ())(logits.expand(n, 12).clone(), 0)
    want = (logits[0] / 0.7).softmax(-1)
    counts = torch.bincount(ids[:-1], minlength=12).tolist()
    stat, df = chi2_goodness_of_fit(counts, want.tolist())
    assert df >= 5 and stat < chi2_critical(df), f"chi2 {stat:.1f} on {df} df"
    assert ids[-1] == logits[0].argmax() and torch.allclose(q[0], want, atol=1e-6)
