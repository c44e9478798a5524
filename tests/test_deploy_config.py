"""The deployment TOML: defaults, validation, paths, clear errors."""

from __future__ import annotations

import pytest

from sharefl.deploy.config import DeploymentConfig, load_config
from sharefl.protocol.errors import ConfigurationError


def test_defaults_and_relative_tls_paths(tmp_path):
    path = tmp_path / "deploy.toml"
    path.write_text(
        '[server]\nclients = 3\nstage_timeout_s = 5\n[tls]\ncert = "k/s.pem"\nkey = "k/s.key"\n'
    )
    config = load_config(path)
    assert config.server.clients == 3 and config.server.stage_timeout_s == 5.0
    assert config.model == DeploymentConfig().model
    assert config.tls.enabled and config.tls.cert == str((tmp_path / "k/s.pem").resolve())


@pytest.mark.parametrize(
    "text,match",
    [
        ("[servr]\n", "unknown table"),
        ("[server]\nclient = 3\n", "unknown key"),
        ('[server]\nclients = "three"\n', "must be an integer"),
        ("[secure_aggregation]\nsigned = 1\n", "must be true or false"),
        ("[secure_aggregation]\nbits = 16\n", "32 or 64"),
        ('[model]\naggregator = "median"\n', "sum"),
        ('[tls]\ncert = "a.pem"\n', "go together"),
        ("[secure_aggregation]\nsigned = true\n", "tls.directory"),
        ("[server\n", "cannot read"),
    ],
)
def test_bad_configs_name_the_problem(tmp_path, text, match):
    path = tmp_path / "deploy.toml"
    path.write_text(text)
    with pytest.raises(ConfigurationError, match=match):
        load_config(path)
