"""Accountant, calibration and the papers' pinned privacy values."""

from __future__ import annotations

import json
import logging
import math

import dp_accounting
import pytest
from conftest import examples
from dp_accounting.rdp import rdp_privacy_accountant
from hypothesis import given, settings
from hypothesis import strategies as st

from sharefl.privacy import (
    AccountantStateError,
    CalibrationError,
    ConstantSchedule,
    LinearSchedule,
    PrivacyAccountant,
    PrivacyConfigError,
    calibrate_noise,
    compute_epsilon,
    theorem3_epsilon,
)

# seed000: |D_i| = 3000, b_c = 16, T = ⌈8·3000/16⌉ = 1500, δ = 1/|D_i|^1.1
SEED000 = {"delta": 1 / 3000**1.1, "sample_rate": 16 / 3000, "steps": 1500}


def test_seed000_calibrates_to_sigma_079_at_epsilon_2():
    sigma = calibrate_noise(2.0, **SEED000)
    assert sigma == pytest.approx(0.792, abs=0.002)  # the paper's 0.79, the logs' 0.79203
    assert compute_epsilon(sigma, **SEED000) <= 2.0


def test_seed003_moments_accountant_value_with_classic_conversion():
    eps = compute_epsilon(6.0, 1e-5, 0.01, 10_000, conversion="classic")
    assert eps == pytest.approx(0.823, abs=5e-4)
    # the improved conversion and PLD are tighter (note: dp_accounting gives 0.659)
    improved = compute_epsilon(6.0, 1e-5, 0.01, 10_000)
    assert improved == pytest.approx(0.659, abs=1e-3)
    assert compute_epsilon(6.0, 1e-5, 0.01, 10_000, "pld") < improved


@pytest.mark.parametrize(
    ("rounds", "want"),
    [(1, 0.084), (5, 0.184), (11, 0.285), (34, 0.478), (67, 0.672), (60, 0.636), (10, 0.276)],
)
def test_seed003_tables_vi_vii(rounds, want):
    """Instance level, q = 0.01, 100 local steps per round, classic conversion."""
    eps = compute_epsilon(6.0, 1e-5, 0.01, 100 * rounds, conversion="classic")
    assert eps == pytest.approx(want, abs=1e-3)


def test_seed003_fed_sdp_client_level():
    """Client level, q = K_t/N = 0.1, T + 1 steps."""
    assert compute_epsilon(6.0, 1e-5, 0.1, 101, conversion="classic") == pytest.approx(
        0.854, abs=1e-3
    )


@pytest.mark.parametrize(("noise", "want"), [(2.0, 1.669), (3.0, 1.097), (5.0, 0.651)])
def test_seed004_theorem3_closed_form(noise, want):
    assert theorem3_epsilon(noise, 10.0, 6000, 50_000, 1e-4) == pytest.approx(want, abs=1e-3)


@pytest.mark.parametrize(
    ("target", "delta", "q", "steps", "backend"),
    [
        (2.0, SEED000["delta"], SEED000["sample_rate"], 1500, "rdp"),
        (0.5, 1e-5, 0.01, 1000, "rdp"),
        (8.0, 1e-6, 0.05, 200, "rdp"),
        (1.0, 1e-5, 1.0, 1, "rdp"),
        (1.0, 1e-5, 0.02, 300, "pld"),
    ],
)
def test_calibration_never_overshoots_and_is_tight(target, delta, q, steps, backend):
    sigma = calibrate_noise(target, delta, q, steps, backend, rtol=1e-4)
    assert compute_epsilon(sigma, delta, q, steps, backend) <= target
    assert compute_epsilon(sigma * (1 - 3e-4), delta, q, steps, backend) > target


@settings(max_examples=examples(6), deadline=None, derandomize=True)
@given(
    target=st.floats(0.2, 10.0),
    log10_delta=st.floats(-8.0, -3.0),
    q=st.floats(1e-3, 1.0),
    steps=st.integers(1, 3000),
    conversion=st.sampled_from(["improved", "classic"]),
)
def test_calibration_never_overshoots_property(target, log10_delta, q, steps, conversion):
    delta = 10.0**log10_delta
    sigma = calibrate_noise(target, delta, q, steps, conversion=conversion, rtol=1e-3)
    assert compute_epsilon(sigma, delta, q, steps, conversion=conversion) <= target


def test_calibration_classic_conversion_needs_more_noise():
    improved = calibrate_noise(1.0, 1e-5, 0.01, 1000)
    classic = calibrate_noise(1.0, 1e-5, 0.01, 1000, conversion="classic")
    assert classic > improved
    assert compute_epsilon(classic, 1e-5, 0.01, 1000, conversion="classic") <= 1.0


def test_calibration_edge_cases():
    assert calibrate_noise(1.0, 1e-5, 0.0, 100) == 0.0
    with pytest.raises(CalibrationError, match="raise the target"):
        calibrate_noise(1e-4, 1e-5, 1.0, 10_000, max_noise_multiplier=10.0)
    for bad in ({"target_epsilon": 0.0}, {"delta": 1.0}, {"sample_rate": 1.5}, {"steps": 0}):
        args = {"target_epsilon": 1.0, "delta": 1e-5, "sample_rate": 0.01, "steps": 10, **bad}
        with pytest.raises(PrivacyConfigError):
            calibrate_noise(**args)


def test_varying_sigma_composes_like_dp_accounting():
    schedule = LinearSchedule(sigma0=3.0, decay=0.1, floor=1.0)
    accountant = PrivacyAccountant()
    for t in range(12):
        accountant.step(schedule(t), 0.02, 10)
    direct = rdp_privacy_accountant.RdpAccountant()
    direct.compose(
        dp_accounting.ComposedDpEvent(
            [
                dp_accounting.SelfComposedDpEvent(
                    dp_accounting.PoissonSampledDpEvent(0.02, dp_accounting.GaussianDpEvent(s)),
                    10,
                )
                for s in schedule.values(12)
            ]
        )
    )
    assert accountant.get_epsilon(1e-5) == pytest.approx(direct.get_epsilon(1e-5), rel=1e-12)
    assert len(accountant.history) == 8  # σ_t = 3(1 − 0.1t) hits the floor 1 at t = 7: merged
    low = compute_epsilon(3.0, 1e-5, 0.02, 120)
    high = compute_epsilon(1.0, 1e-5, 0.02, 120)
    assert low < accountant.get_epsilon(1e-5) < high


def test_accountant_incremental_equals_one_shot_and_backends_order():
    for backend in ("rdp", "pld"):
        acc = PrivacyAccountant(backend)
        for _ in range(4):
            acc.step(1.1, 0.01, 25)
            eps_so_far = acc.get_epsilon(1e-5)  # compose lazily between steps
        assert eps_so_far == pytest.approx(compute_epsilon(1.1, 1e-5, 0.01, 100, backend))
        assert acc.history == (acc.history[0],) and acc.steps == 100
    rdp_classic = compute_epsilon(1.1, 1e-5, 0.01, 100, conversion="classic")
    rdp = compute_epsilon(1.1, 1e-5, 0.01, 100)
    pld = compute_epsilon(1.1, 1e-5, 0.01, 100, "pld")
    assert pld < rdp < rdp_classic


def test_accountant_special_values():
    acc = PrivacyAccountant(conversion="classic")
    assert acc.get_epsilon(1e-5) == 0.0
    acc.step(1.0, 0.0, 100)  # never sampled: free
    assert acc.get_epsilon(1e-5) == 0.0
    acc.step(0.0, 0.5)  # no noise: no privacy
    assert math.isinf(acc.get_epsilon(1e-5))
    with pytest.raises(PrivacyConfigError):
        acc.step(-1.0, 0.1)
    with pytest.raises(PrivacyConfigError):
        acc.step(1.0, 0.1, 0)
    with pytest.raises(PrivacyConfigError):
        acc.get_epsilon(0.0)
    with pytest.raises(PrivacyConfigError, match="backend='rdp'"):
        PrivacyAccountant("pld", conversion="classic")


@pytest.mark.parametrize("backend", ["rdp", "pld"])
def test_accountant_state_round_trip(tmp_path, backend):
    acc = PrivacyAccountant(backend)
    schedule = ConstantSchedule(1.5)
    acc.step(schedule(0), 0.01, 50)
    acc.step(2.0, 0.02, 30)
    path = tmp_path / "accountant.json"
    acc.save(path)
    loaded = PrivacyAccountant.load(path)
    assert loaded.history == acc.history and loaded.backend == backend
    assert loaded.get_epsilon(1e-5) == acc.get_epsilon(1e-5)
    loaded.step(2.0, 0.02, 10)  # continues where it stopped, merged with the last entry
    assert loaded.history[-1].steps == 40
    fresh = PrivacyAccountant(backend)
    fresh.load_state_dict(json.loads(path.read_text()))
    assert fresh.history == acc.history


def test_accountant_state_errors(tmp_path):
    state = PrivacyAccountant().state_dict()
    with pytest.raises(AccountantStateError, match="from_state_dict"):
        PrivacyAccountant(conversion="classic").load_state_dict(state)
    with pytest.raises(AccountantStateError, match="format"):
        PrivacyAccountant().load_state_dict({**state, "format": "opacus"})
    with pytest.raises(AccountantStateError, match="malformed"):
        PrivacyAccountant().load_state_dict({**state, "history": [[1.0, 2.0, 3]]})
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(AccountantStateError, match="JSON"):
        PrivacyAccountant.load(bad)


@pytest.mark.slow
def test_seed000_pld_calibration_is_below_rdp_and_never_overshoots():
    rdp = calibrate_noise(2.0, **SEED000)
    pld = calibrate_noise(2.0, **SEED000, accountant="pld")
    assert pld < rdp
    assert compute_epsilon(pld, **SEED000, accountant="pld") <= 2.0


def test_excluded_rdp_orders_print_nothing(caplog, monkeypatch):
    """dp-accounting logs one WARNING:absl line per RDP order it excludes (σ = 0.5, q = 0.2
    excludes six); sharefl drops those lines, and ε is unchanged."""
    import sharefl.privacy.accountant as accountant_module

    def epsilon() -> float:
        accountant = PrivacyAccountant()
        accountant.step(0.5, 0.2, 300)
        return accountant.get_epsilon(1e-5)

    logger = logging.getLogger("absl")
    with caplog.at_level(logging.WARNING, logger="absl"):
        quiet = epsilon()
    assert not [r for r in caplog.records if "failed to converge" in str(r.msg)]
    filters = [f for f in logger.filters if isinstance(f, accountant_module._ExcludedOrderFilter)]
    for f in filters:
        logger.removeFilter(f)
    monkeypatch.setattr(accountant_module, "quiet_excluded_orders", lambda: None)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="absl"):
        loud = epsilon()
    for f in filters:
        logger.addFilter(f)
    assert len([r for r in caplog.records if "failed to converge" in str(r.msg)]) == 6
    assert quiet == loud
