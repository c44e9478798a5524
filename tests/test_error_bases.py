"""One base exception per package under one root, and no class name defined twice.

Every public exception class a package defines derives from that package's base, so a caller
can catch "anything sharefl.crypto refused" with one ``except``, and every base derives from
:class:`~sharefl.errors.ShareflError`, so one ``except`` catches anything sharefl raised on
purpose; each error's ``exit_status`` is what the command line exits with. No two modules define a
public class (exception, config or record) under the same name, so an import never silently
picks the wrong one (the generated protobuf module ``sharefl.proto`` is excluded: its message
classes mirror the protocol's on purpose).
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections import defaultdict

import pytest

import sharefl
from sharefl.crypto.errors import CryptoError
from sharefl.deploy.errors import DeployError
from sharefl.errors import ConfigurationError, ShareflError, UserError
from sharefl.exit_status import ExitStatus
from sharefl.privacy.errors import PrivacyError
from sharefl.protocol.errors import ProtocolError
from sharefl.robust.base import AggregationError
from sharefl.simulator.errors import SimulatorError

BASES: dict[str, type[BaseException]] = {
    "sharefl.crypto": CryptoError,
    "sharefl.protocol": ProtocolError,
    "sharefl.deploy": DeployError,
    "sharefl.integrations": ProtocolError,
    "sharefl.rounds": ProtocolError,  # the round layer: every error is a configuration one
    "sharefl.robust": AggregationError,
    "sharefl.privacy": PrivacyError,
    "sharefl.simulator": SimulatorError,
    "sharefl.errors": ShareflError,  # the root, and the CLI's own UserError
}


def _modules() -> list:
    names = [
        info.name
        for info in pkgutil.walk_packages(sharefl.__path__, "sharefl.")
        if info.name != "sharefl.proto" and not info.name.startswith("sharefl.proto.")
    ]
    return [importlib.import_module(name) for name in names]


def _defined_classes() -> list[tuple[str, type]]:
    """(module, class) for every public class defined (not imported) in a sharefl module."""
    found = []
    for module in _modules():
        for name, obj in vars(module).items():
            defined_here = inspect.isclass(obj) and obj.__module__ == module.__name__
            if defined_here and not name.startswith("_") and obj.__name__ == name:
                found.append((module.__name__, obj))
    return found


def _package(module: str) -> str:
    return ".".join(module.split(".")[:2])


def test_every_public_exception_derives_from_its_package_base():
    wrong = []
    exceptions = [(m, c) for m, c in _defined_classes() if issubclass(c, BaseException)]
    for module, cls in exceptions:
        base = BASES.get(_package(module))
        if base is None:
            wrong.append(f"{module}.{cls.__name__}: no base exception for {_package(module)}")
        elif not issubclass(cls, (base, ConfigurationError)):  # or the configuration root
            wrong.append(f"{module}.{cls.__name__} does not derive from {base.__name__}")
    assert len(exceptions) > 40  # the walk found the package's exceptions
    assert not wrong, "\n".join(wrong)


def test_every_exception_has_the_one_root_and_says_what_the_command_line_exits_with():
    exceptions = [c for _, c in _defined_classes() if issubclass(c, BaseException)]
    assert [c for c in exceptions if not issubclass(c, ShareflError)] == []
    for cls in exceptions:
        assert cls.exit_status is None or isinstance(cls.exit_status, ExitStatus), cls
    assert UserError("x", ExitStatus.REFUSED).exit_status is ExitStatus.REFUSED


def test_every_configuration_error_has_the_one_root_which_alone_states_its_status():
    """Exit status 2 ("bad command line or configuration") is stated once, by
    :class:`ConfigurationError`; every error with that status derives from it, and the
    protocol's name for it is the same class."""
    from sharefl.protocol.errors import ConfigurationError as ProtocolConfigurationError

    assert ProtocolConfigurationError is ConfigurationError
    assert ConfigurationError.exit_status is ExitStatus.CONFIG
    exceptions = [c for _, c in _defined_classes() if issubclass(c, BaseException)]
    config = [c for c in exceptions if c.exit_status is ExitStatus.CONFIG]
    assert len(config) > 20  # the walk found them
    assert [c for c in config if not issubclass(c, ConfigurationError)] == []
    restated = [c for c in config if c is not ConfigurationError and "exit_status" in vars(c)]
    assert restated == []


def test_package_bases_are_distinct_and_deploy_errors_are_protocol_errors():
    assert issubclass(DeployError, ProtocolError)
    roots = {CryptoError, ProtocolError, AggregationError, PrivacyError, SimulatorError}
    for a in roots:
        for b in roots - {a}:
            assert not issubclass(a, b), (a, b)


@pytest.mark.parametrize(
    ("module", "name", "base"),
    [
        ("sharefl.protocol.clustering", "ClusteringError", ProtocolError),
        ("sharefl.protocol.audit", "AuditError", ProtocolError),
        ("sharefl.protocol.audit", "SafeSamplingError", ProtocolError),
        ("sharefl.protocol.bundles", "BundleError", ProtocolError),
        ("sharefl.protocol.records", "RecordError", ProtocolError),
        ("sharefl.deploy.wire", "WireError", DeployError),
        ("sharefl.deploy.results", "ResumeError", DeployError),
        ("sharefl.crypto.errors", "CryptoParameterError", CryptoError),
    ],
)
def test_named_errors_keep_their_builtin_base_too(module, name, base):
    cls = getattr(importlib.import_module(module), name)
    assert issubclass(cls, base)
    builtin = RuntimeError if name == "SafeSamplingError" else ValueError
    assert issubclass(cls, builtin)  # existing `except ValueError` handlers still work


def test_no_public_class_name_is_defined_twice():
    where: dict[str, list[str]] = defaultdict(list)
    for module, cls in _defined_classes():
        where[cls.__name__].append(module)
    twice = {name: modules for name, modules in where.items() if len(modules) > 1}
    assert not twice, twice


@pytest.mark.parametrize(
    "call",
    [
        lambda: __import__("sharefl.crypto.kdf").crypto.kdf.KeyContext(round=-1),
        lambda: __import__("sharefl.crypto.kdf").crypto.kdf.KeyContext(round=0, plan=b"x"),
        lambda: __import__("sharefl.crypto.signatures").crypto.signatures.client_list_message(
            __import__("sharefl.crypto.kdf").crypto.kdf.KeyContext(round=0), [3, 3], "x"
        ),
    ],
)
def test_caller_errors_in_crypto_are_crypto_errors(call):
    with pytest.raises(CryptoError):
        call()
