"""The DP-RSA loop (seed002) on small synthetic data: the master's sign-sum step, the
vectorised worker gradients against a per-worker loop, Sign-Flipping's rate, robustness to
the Gaussian attack, secure sign sums, accounting, configuration and results."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from torch import nn

from sharefl.privacy.errors import PrivacyConfigError
from sharefl.privacy.sign import SignGaussian, sign_flip_gamma
from sharefl.privacy.sign_accounting import composed_epsilon, exact_composed_epsilon
from sharefl.robust import rsa_sign
from sharefl.simulator import report
from sharefl.simulator.config import SimulationConfigError, expand
from sharefl.simulator.dp_rsa.attacks import SignAttack
from sharefl.simulator.dp_rsa.loop import RSALoop, ring_signs, signed_ring_sum
from sharefl.simulator.loops import build_loop
from sharefl.simulator.runner import run_one


def config(**dp_rsa) -> dict:
    base = {
        "name": "rsa_test",
        "seed": 1,
        "rounds": 5,
        "eval_every": 5,
        "data": {
            "dataset": "synthetic",
            "options": {"shape": [1, 6, 6], "num_examples": 600},
        },
        "model": {"name": "dp_rsa_mlp", "init_seed": 3},
        "clients": {"honest": 6, "byzantine": 0},
        "training": {"batch_size": 1},
        "secure_aggregation": {"cluster_size": 1},
        "algorithm": {"name": "dp_rsa"},
        "dp_rsa": {"method": "rsa", **dp_rsa},
    }
    return base


def loop_of(data: dict) -> RSALoop:
    (run,) = expand(data)
    loop = build_loop(run)
    assert isinstance(loop, RSALoop)
    return loop


def test_master_moves_by_lambda_alpha_sign_sum():
    loop = loop_of(config(regularization=0.0, lr=0.03, penalty=0.02))
    for _ in range(3):
        x0, xk = loop.x0.clone(), loop.xk.clone()
        loop.step()
        signs = rsa_sign(x0.unsqueeze(0) - xk).sum(0)
        torch.testing.assert_close(loop.x0, x0 - 0.03 * 0.02 * signs, rtol=0, atol=1e-7)


def test_sign_of_zero_is_plus_one_at_equal_initialisation():
    loop = loop_of(config(init="same", regularization=0.002))
    x0 = loop.x0.clone()
    loop.step()  # u = 0 for every worker: every message is +1
    expected = x0 - 0.01 * (0.004 * x0 + 0.01 * 6)
    torch.testing.assert_close(loop.x0, expected)


def test_worker_step_uses_the_sent_sign_and_matches_a_per_worker_loop():
    loop = loop_of(config(method="dp_rsa_f", epsilon=0.4))
    x0, xk = loop.x0.clone(), loop.xk.clone()
    gen = torch.Generator().set_state(loop.generator.get_state())
    sampler_state = (loop.gradients.sampler.order, loop.gradients.sampler.position)
    loop.step()
    # reference: the same draws, one worker at a time with autograd
    u = x0.unsqueeze(0) - xk
    keep = torch.rand(u.shape, generator=gen) < sign_flip_gamma(0.4)
    sent = torch.where(keep, rsa_sign(u), -rsa_sign(u))
    sampler = loop.gradients.sampler
    sampler.order, sampler.position = sampler_state
    rows = sampler.next(gen)
    data = loop.train_set
    expected = []
    for k in range(len(xk)):
        w = xk[k].clone().requires_grad_(True)
        out = loop.model(w, data.inputs[rows[k]])
        (g,) = torch.autograd.grad(nn.functional.cross_entropy(out, data.targets[rows[k]]), w)
        expected.append(xk[k] - 0.01 * (g - 0.01 * sent[k]))
    torch.testing.assert_close(loop.xk, torch.stack(expected), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(loop.x0, x0 - 0.01 * (0.004 * x0 + 0.01 * sent.sum(0)))


class Spy(SignAttack):
    """Records the regular workers' raw and sent messages."""

    seen: list

    def messages(self, count, x0, raw, sent, generator):
        self.seen.append((raw.clone(), sent.clone()))
        return super().messages(count, x0, raw, sent, generator)


@pytest.mark.parametrize("epsilon", [0.2, 1.38])
def test_sign_flipping_flips_at_the_theorem_rate(epsilon):
    data = config(method="dp_rsa_f", epsilon=epsilon)
    data["clients"]["byzantine"] = 1
    loop = loop_of(data)
    loop.attack = Spy(name="none")
    object.__setattr__(loop.attack, "seen", [])
    for _ in range(5):
        loop.step()
    flips = sum(int((raw != sent).sum()) for raw, sent in loop.attack.seen)
    n = sum(raw.numel() for raw, _ in loop.attack.seen)
    p = 1 - sign_flip_gamma(epsilon)
    z = (flips / n - p) / math.sqrt(p * (1 - p) / n)
    assert abs(z) < 4.5, (flips / n, p)


def learn(method: str, attack: str, rounds: int = 300) -> float:
    data = config(method=method, lr=0.05, penalty=0.02, init="same")
    data.update(rounds=rounds, eval_every=rounds)
    data["clients"] = {"honest": 8, "byzantine": 2}
    data["training"] = {"batch_size": 4}
    data["attack"] = {"name": attack}
    loop = loop_of(data)
    return loop.run_rounds().accuracy


def test_gaussian_attack_breaks_sgd_not_rsa():
    assert learn("sgd", "none") > 0.8
    assert learn("sgd", "gaussian") < 0.3
    assert learn("rsa", "gaussian") > 0.6
    assert learn("sgd_gm", "gaussian") > 0.6


def baseline_loop(method: str, rounds: int = 5, **options) -> RSALoop:
    """27 regular and 3 Byzantine workers (MNIST's b/K) under sign-flipping, α = 0.05."""
    data = config(method=method, lr=0.05)
    data.update(rounds=rounds, eval_every=rounds)
    data["clients"] = {"honest": 27, "byzantine": 3}
    data["training"] = {"batch_size": 4}
    data["attack"] = {"name": "sign_flipping", "options": options}
    return loop_of(data)


def honest_gradients(loop: RSALoop) -> torch.Tensor:
    """The regular workers' gradients of the loop's next step at x0, one worker at a time
    with autograd from a copy of its generator and sampler (an oracle for the vmap path)."""
    gen = torch.Generator().set_state(loop.generator.get_state())
    sampler = loop.gradients.sampler
    state = (sampler.order, sampler.position)
    rows = sampler.next(gen)
    sampler.order, sampler.position = state
    data, grads = loop.train_set, []
    for k in range(loop.regular):
        w = loop.x0.clone().requires_grad_(True)
        out = loop.model(w, data.inputs[rows[k]])
        (g,) = torch.autograd.grad(nn.functional.cross_entropy(out, data.targets[rows[k]]), w)
        grads.append(g)
    return torch.stack(grads)


@pytest.mark.parametrize("method", ["sgd", "signsgd", "sgd_gm"])
def test_sign_flipping_baselines_receive_minus_five_times_the_model(method):
    loop = baseline_loop(method)
    x0, g = loop.x0.clone(), honest_gradients(loop)
    byzantine = (-5.0 * x0).expand(3, -1)
    seen = []
    median = loop.median
    loop.median = lambda rows: (seen.append(rows.clone()), median(rows))[1]
    loop.step()
    if method == "sgd":  # x ← x − α (Σ g_k − 15 x) / 30
        expected = x0 - 0.05 * (g.sum(0) - 15.0 * x0) / 30
        torch.testing.assert_close(loop.x0, expected, rtol=1e-5, atol=1e-6)
    elif method == "signsgd":
        signs = torch.cat([torch.where(g >= 0, 1.0, -1.0), torch.where(-x0 >= 0, 1.0, -1.0)[None]])
        weights = torch.tensor([1.0] * 27 + [3.0])[:, None]
        expected = x0 - 0.05 * (weights * signs).sum(0) / 30
        torch.testing.assert_close(loop.x0, expected, rtol=0, atol=1e-7)
    else:
        (rows,) = seen
        torch.testing.assert_close(rows[27:], byzantine)
        torch.testing.assert_close(rows[:27], g, rtol=1e-5, atol=1e-6)


def test_sign_flipping_now_drives_sgd_away_where_the_gradient_reading_only_shortened_it():
    # one step, b/K = 3/30 as on MNIST: the model reading moves x by +α·0.5·x away from the
    # honest step, the gradient reading moves it by exactly 0.4 × the honest mean step
    model, grad = baseline_loop("sgd"), baseline_loop("sgd", baseline_flip="gradient")
    x0, g = model.x0.clone(), honest_gradients(model)
    honest_step = -0.05 * g.mean(0)
    model.step()
    grad.step()
    torch.testing.assert_close(grad.x0 - x0, 0.4 * honest_step, rtol=1e-4, atol=1e-7)
    moved = model.x0 - x0
    torch.testing.assert_close(moved, 0.9 * honest_step + 0.05 * 0.5 * x0, rtol=1e-4, atol=1e-7)
    assert torch.linalg.vector_norm(model.x0) > torch.linalg.vector_norm(x0)
    # over 300 steps: under the model reading ‖x‖ grows like 1.025^t (α·5b/K = 0.025) and
    # the test loss explodes; the gradient reading learns (no attack: 83% here)
    growth, loss, accuracy = sgd_run_under_flipping("model")
    assert growth > 1.025**300 / 10 and loss > 10 * math.log(10)
    growth, loss, accuracy = sgd_run_under_flipping("gradient")
    assert growth < 2 and loss < math.log(10) and accuracy > 0.5


def sgd_run_under_flipping(flip: str, rounds: int = 300) -> tuple[float, float, float]:
    """(‖x_T‖ / ‖x_0‖, test loss, test accuracy) of SGD after ``rounds`` steps."""
    loop = baseline_loop("sgd", rounds=rounds, baseline_flip=flip)
    start = torch.linalg.vector_norm(loop.x0)
    record = loop.run_rounds()
    growth = float(torch.linalg.vector_norm(loop.x0) / start)
    return growth, record.loss, record.accuracy


def test_sign_ring_round_trip_and_secure_sum_equals_clear_sum():
    gen = torch.Generator().manual_seed(0)
    messages = rsa_sign(torch.randn(9, 50, generator=gen))
    ring = ring_signs(messages)
    assert ring[0].dtype == np.uint32 and set(np.unique(ring[0])) <= {1, 2**32 - 1}
    clear = messages.sum(0)
    assert signed_ring_sum(list(ring.values())).tolist() == clear.long().tolist()
    data = config()
    data["clients"] = {"honest": 7, "byzantine": 2}
    data["secure_aggregation"] = {"cluster_size": 3}
    loop = loop_of(data)
    assert loop.clustered
    assert torch.equal(loop.sign_sum(messages), clear)


@pytest.mark.parametrize("cluster_size", [3, 9])
def test_secure_run_equals_run_in_the_clear(cluster_size):
    def final(size: int) -> tuple[torch.Tensor, float]:
        data = config(method="dp_rsa_g", epsilon=0.4)
        data["clients"] = {"honest": 7, "byzantine": 2}
        data["attack"] = {"name": "gaussian"}
        data["secure_aggregation"] = {"cluster_size": size}
        loop = loop_of(data)
        record = loop.run_rounds()
        return loop.x0, record.accuracy

    x_secure, acc_secure = final(cluster_size)
    x_clear, acc_clear = final(1)
    assert torch.equal(x_secure, x_clear) and acc_secure == acc_clear


def test_attack_messages():
    x0 = torch.tensor([0.5, -0.2, 0.0])
    raw = torch.tensor([[1.0, -1.0, 1.0], [-1.0, -1.0, 1.0]])
    sent = -raw
    gen = torch.Generator().manual_seed(0)
    flip = SignAttack(name="sign_flipping").messages(2, x0, raw, sent, gen)
    assert flip.tolist() == [rsa_sign(x0).tolist()] * 2  # sign(x0 + 5 x0) = sign(x0)
    dup = SignAttack(name="sample_duplicating").messages(3, x0, raw, sent, gen)
    assert dup.tolist() == [raw[0].tolist()] * 3
    dup_sent = SignAttack(name="sample_duplicating", message="sent").messages(1, x0, raw, sent, gen)
    assert dup_sent.tolist() == [sent[0].tolist()]
    shared = SignAttack(name="gaussian").messages(3, x0, raw, sent, gen)
    assert (shared == shared[0]).all() and set(shared.unique().tolist()) <= {-1.0, 1.0}
    grads = torch.tensor([[1.0, 2.0, 3.0], [3.0, 2.0, 1.0]])
    # the paper's attack (ii): −5 × the true model, here the shared model x0 = [0.5, −0.2, 0]
    flipped = SignAttack(name="sign_flipping").gradients(2, x0, grads, gen)
    assert flipped.tolist() == [[-2.5, 1.0, 0.0]] * 2
    earlier = SignAttack(name="sign_flipping", baseline_flip="gradient")
    assert earlier.gradients(1, x0, grads, gen).tolist() == [[-10.0] * 3]  # −5 × mean [2, 2, 2]
    assert (
        SignAttack(name="sample_duplicating").gradients(2, x0, grads, gen).tolist()
        == [[1.0, 2.0, 3.0]] * 2
    )
    with pytest.raises(SimulationConfigError, match="baseline_flip"):
        SignAttack.from_config("sign_flipping", {"baseline_flip": "update"})
    with pytest.raises(SimulationConfigError):
        SignAttack.from_config("ipm", {})
    with pytest.raises(SimulationConfigError):
        SignAttack.from_config("gaussian", {"sigma": 3})


def test_scalar_sigma_is_one_per_worker():
    mech = SignGaussian(0.4, 2e-4)
    u = torch.tensor([[0.3, -0.9], [0.0, 0.0]])
    sigma = mech.sigma(u)
    assert sigma.shape == (2, 1)
    assert sigma[0, 0] >= 0.6 and sigma[1, 0] >= mech.noise_floor
    assert mech.sigma(u[0]).shape == ()
    code = SignGaussian(0.4, 2e-4, per_coordinate=True, signed_u=True)
    assert code.sigma(u)[0, 1] == pytest.approx(mech.noise_floor)  # signed u_i < 0: the floor
    with pytest.raises(PrivacyConfigError):
        SignGaussian(0.4, 2e-4, signed_u=True)


@pytest.mark.parametrize("epsilon", [0.2, 0.4, 1.38])
@pytest.mark.parametrize("rounds", [1, 30, 400])
def test_composed_epsilon_matches_the_exact_binomial_formula(epsilon, rounds):
    got = composed_epsilon(epsilon, rounds, 1e-5)
    exact = exact_composed_epsilon(epsilon, rounds, 1e-5)
    assert exact - 1e-6 <= got <= exact * 1.01 + 1e-3  # pessimistic, and close
    assert got <= rounds * epsilon + 1e-3  # never worse than basic composition


def test_configuration_errors():
    with pytest.raises(SimulationConfigError, match="epsilon"):
        expand(config(method="dp_rsa_f"))
    with pytest.raises(SimulationConfigError, match=r"privacy\.enabled"):
        data = config()
        data["privacy"] = {"enabled": True, "noise_multiplier": 1.0}
        expand(data)
    data = config(method="sgd")
    data["secure_aggregation"] = {"cluster_size": 3}
    with pytest.raises(SimulationConfigError, match="cluster_size"):
        loop_of(data)
    data = config()
    data["attack"] = {"name": "alie"}
    data["clients"]["byzantine"] = 1
    with pytest.raises(SimulationConfigError, match="dp_rsa"):
        loop_of(data)


def test_federated_run_ids_do_not_change_with_the_algorithm_section():
    data = config()
    data.pop("algorithm")
    data.pop("dp_rsa")
    (plain,) = expand(data)
    data["algorithm"] = {"name": "federated"}
    (explicit,) = expand(data)
    assert plain.run_id == explicit.run_id


def test_results_written_with_the_common_schema(tmp_path):
    data = config(method="dp_rsa_g", epsilon=0.4)
    data.update(rounds=6, eval_every=3)
    (run,) = expand(data)
    outcome = run_one(run, tmp_path)
    summary = json.loads((outcome.folder / "summary.json").read_text())
    assert summary["privacy"]["mechanism"] == "sign_gaussian"
    assert "no ε is guaranteed" in summary["privacy"]["guarantee"]  # M not enforced
    assert summary["delta"] == 1e-5
    assert summary["epsilon"] == pytest.approx(composed_epsilon(0.4, 6, 1e-5), rel=1e-3)
    (record,) = report.load_runs(tmp_path)
    assert record.finished and [r.round for r in record.rounds] == [3, 6]
    lines = [json.loads(x) for x in (outcome.folder / "rounds.jsonl").read_text().splitlines()]
    assert {"disagreement", "epsilon_round"} <= set(lines[0])
