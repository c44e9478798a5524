"""Each attack of sharefl.simulator.federated.attacks produces its documented vector."""

from __future__ import annotations

import math

import pytest
import torch

from sharefl.robust import Mean, metropolis_hastings_weights
from sharefl.simulator.dp_rsa.attacks import rsa_messages
from sharefl.simulator.federated.attacks import (
    OLMP,
    ALittleIsEnough,
    AttackError,
    AttackView,
    FallOfEmpires,
    GaussianAttack,
    Isolation,
    Knowledge,
    LabelFlipping,
    Mimic,
    MinMax,
    SampleDuplicating,
    SignFlipping,
    TimeToBeByzantine,
    alie_z_max,
    inner_product_manipulation,
)


def t(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


HONEST = t([[1.0, 0.0], [3.0, 2.0], [2.0, 4.0], [2.0, 2.0]])  # mean [2, 2]
OWN = t([[1.0, 1.0], [3.0, -1.0]])  # mean [2, 0]
VIEW = AttackView(num_byzantine=2, own=OWN, honest=HONEST, round=3, num_rounds=10)


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_label_flipping() -> None:
    flip = LabelFlipping(num_classes=10)
    assert flip(torch.tensor([0, 3, 9])).tolist() == [9, 6, 0]
    with pytest.raises(AttackError):
        flip(torch.tensor([10]))
    with pytest.raises(AttackError):
        LabelFlipping(num_classes=1)


def test_sign_flipping() -> None:
    torch.testing.assert_close(SignFlipping()(VIEW), -OWN)
    torch.testing.assert_close(SignFlipping(scale=10.0)(VIEW), -10 * OWN)
    assert SignFlipping().knowledge is Knowledge.OWN
    with pytest.raises(AttackError, match="own updates"):
        SignFlipping()(AttackView(num_byzantine=2, honest=HONEST))


def test_gaussian() -> None:
    out = GaussianAttack(std=2.0, mean=1.0)(VIEW, gen())
    expected = 1.0 + 2.0 * torch.randn(2, 2, generator=gen(), dtype=torch.float64)
    torch.testing.assert_close(out, expected)
    shared = GaussianAttack(std=2.0, shared=True)(VIEW, gen())
    assert torch.equal(shared[0], shared[1])
    centred = GaussianAttack(std=0.0, around_honest_mean=True)(VIEW, gen())
    torch.testing.assert_close(centred, t([[2.0, 2.0], [2.0, 2.0]]))
    pure = GaussianAttack(std=1.0)(AttackView(num_byzantine=3, dim=5), gen())
    assert pure.shape == (3, 5) and pure.dtype == torch.float32
    assert GaussianAttack(std=1.0).knowledge is Knowledge.NONE
    with pytest.raises(AttackError, match="Generator"):
        GaussianAttack(std=1.0)(VIEW)


def test_fall_of_empires_and_inner_product_manipulation() -> None:
    # SHARE's modified FoE: beta times the mean of the Byzantine workers' own updates
    torch.testing.assert_close(FallOfEmpires(beta=-10.0)(VIEW), t([[-20.0, 0.0]] * 2))
    ipm = inner_product_manipulation(0.5)
    torch.testing.assert_close(ipm(VIEW), t([[-1.0, -1.0]] * 2))
    assert ipm.knowledge is Knowledge.OMNISCIENT
    assert FallOfEmpires(beta=-1.0).knowledge is Knowledge.OWN


def test_a_little_is_enough() -> None:
    # honest std: [sqrt(0.5), sqrt(2)]
    std = t([math.sqrt(0.5), math.sqrt(2.0)])
    torch.testing.assert_close(
        ALittleIsEnough(z=1.5)(VIEW), (t([2.0, 2.0]) - 1.5 * std).repeat(2, 1)
    )
    # Baruch et al.: n = 50, b = 12 -> s = 14, z = Φ^-1(36/50) = 0.5828
    assert alie_z_max(50, 12) == pytest.approx(0.58284, abs=1e-4)
    auto = ALittleIsEnough()
    z = alie_z_max(6, 2)  # n = h + b = 6: s = 2, Φ^-1(4/6)
    assert auto.z_for(VIEW) == pytest.approx(z)
    torch.testing.assert_close(auto(VIEW), (t([2.0, 2.0]) - z * std).repeat(2, 1))
    own = ALittleIsEnough(z=1.0, reference="byzantine")(VIEW)
    torch.testing.assert_close(own, t([[1.0, -1.0]] * 2))
    with pytest.raises(AttackError, match="num_workers"):
        ALittleIsEnough(reference="byzantine")(AttackView(num_byzantine=2, own=OWN))


def test_olmp_and_its_feasibility() -> None:
    view = AttackView(num_byzantine=3, honest=HONEST)  # M = 3 > sqrt(4) = 2
    torch.testing.assert_close(OLMP()(view), (-HONEST.sum(dim=0) / 2).repeat(3, 1))
    with pytest.raises(AttackError, match="does not exist"):
        OLMP()(VIEW)  # M = 2 = sqrt(4)
    # the Byzantine sum is -(1 + λ) Σ honest with λ = M/sqrt(B) - 1
    assert float(OLMP()(view).sum(dim=0)[0]) == pytest.approx(-(3 / 2) * 8)


def test_min_max() -> None:
    out = MinMax()(VIEW)
    mean = HONEST.mean(dim=0)
    p = -mean / mean.norm()
    gamma = MinMax().gamma(HONEST)
    torch.testing.assert_close(out, (mean + gamma * p).repeat(2, 1))
    # the largest admissible gamma: the farthest honest update is exactly at the diameter
    diameter = torch.cdist(HONEST, HONEST).max()
    torch.testing.assert_close((HONEST - out[0]).norm(dim=1).max(), diameter)
    for perturbation in ("std", "sign"):
        attack = MinMax(perturbation=perturbation)
        assert float((HONEST - attack(VIEW)[0]).norm(dim=1).max()) <= float(diameter) + 1e-9
    with pytest.raises(AttackError):
        MinMax(perturbation="cube")(VIEW)  # type: ignore[arg-type]


def test_mimic_is_sample_duplicating() -> None:
    assert SampleDuplicating is Mimic
    torch.testing.assert_close(Mimic()(VIEW), HONEST[[0, 0]])
    torch.testing.assert_close(Mimic(target=2)(VIEW), HONEST[[2, 2]])
    with pytest.raises(AttackError):
        Mimic(target=4)(VIEW)


def test_isolation_cancels_the_mix() -> None:
    # agent 0 with honest neighbours 1, 2 and Byzantine neighbours 3, 4 (MH weights)
    A = torch.tensor(
        [[0, 1, 1, 1, 1], [1, 0, 1, 0, 0], [1, 1, 0, 0, 1], [1, 0, 0, 0, 1], [1, 0, 1, 1, 0]]
    )
    W = metropolis_hastings_weights(A)
    models = t([[0.5, 1.0], [3.0, -2.0], [-1.0, 4.0]])
    sent = Isolation()(models[0], models[1:], W[0, [1, 2]], W[0, [3, 4]])
    mixed = W[0, 0] * models[0] + W[0, 1:3] @ models[1:] + W[0, 3:] @ sent
    torch.testing.assert_close(mixed, models[0])
    assert torch.equal(sent[0], sent[1])
    with pytest.raises(AttackError):
        Isolation()(models[0], models[1:], W[0, [1, 2]], torch.zeros(0))


def test_time_to_be_byzantine() -> None:
    attack = TimeToBeByzantine(attack=SignFlipping(scale=10.0), start=0.4)
    early = AttackView(num_byzantine=2, own=OWN, honest=HONEST, round=3, num_rounds=10)
    late = AttackView(num_byzantine=2, own=OWN, honest=HONEST, round=4, num_rounds=10)
    copied = attack(early, gen(1))
    picks = torch.randint(4, (2,), generator=gen(1))
    torch.testing.assert_close(copied, HONEST[picks])
    torch.testing.assert_close(attack(late, gen(1)), -10 * OWN)
    own_first = TimeToBeByzantine(attack=SignFlipping(), start=0.5, before="own")
    torch.testing.assert_close(own_first(early), OWN)
    assert attack.knowledge is Knowledge.OMNISCIENT
    assert own_first.knowledge is Knowledge.OWN
    with pytest.raises(AttackError, match="num_rounds"):
        attack(AttackView(num_byzantine=2, own=OWN), gen())
    with pytest.raises(AttackError):
        TimeToBeByzantine(attack=SignFlipping(), start=1.5)


def test_rsa_messages() -> None:
    x0 = t([1.0, -1.0])
    z = t([[2.0, -2.0], [1.0, 0.0]])
    assert rsa_messages(x0, z).tolist() == [[-1.0, 1.0], [1.0, -1.0]]


def test_views_are_checked() -> None:
    with pytest.raises(AttackError, match="num_byzantine"):
        AttackView(num_byzantine=3, own=OWN)
    with pytest.raises(AttackError, match="disagree"):
        AttackView(num_byzantine=2, own=OWN, honest=torch.zeros(3, 5, dtype=torch.float64))
    with pytest.raises(AttackError, match="dimension"):
        AttackView(num_byzantine=2)
    with pytest.raises(AttackError, match="omniscient"):
        Mimic()(AttackView(num_byzantine=2, own=OWN))


def test_attacks_keep_dtype_and_break_the_mean() -> None:
    signal = torch.ones(16)
    honest = signal + 0.1 * torch.randn(8, 16, generator=gen(2))
    own = signal + 0.1 * torch.randn(3, 16, generator=gen(3))  # computed on their own data
    view = AttackView(num_byzantine=3, own=own, honest=honest)
    for attack in (
        SignFlipping(scale=10.0),
        FallOfEmpires(beta=-10.0),
        ALittleIsEnough(),
        MinMax(),
        Mimic(),
        OLMP(),
    ):
        out = attack(view, gen())
        assert out.shape == (3, 16) and out.dtype == torch.float32
    poisoned = Mean()(torch.cat([honest, SignFlipping(scale=100.0)(view)]))
    assert float(poisoned @ honest.mean(dim=0)) < 0
