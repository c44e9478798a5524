"""``sharefl keygen`` writes its folder and files with fixed modes, whatever the umask: the
folder 0700, private keys and identities 0600, certificates and the directory 0644."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from sharefl.deploy.keygen import keygen

PRIVATE = {"ca.key", "server.key", "client-0.key", "client-1.key"}
PRIVATE |= {"client-0.identity", "client-1.identity"}
PUBLIC = {"ca.pem", "server.pem", "client-0.pem", "client-1.pem", "directory.json"}


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("umask", [0o000, 0o022, 0o077], ids=["umask0", "umask022", "umask077"])
@pytest.mark.parametrize("existing", [False, True], ids=["new-folder", "empty-folder"])
def test_keygen_modes_do_not_depend_on_the_umask(tmp_path, umask, existing):
    out = tmp_path / "keys"
    if existing:
        out.mkdir(mode=0o777)
        os.chmod(out, 0o777)  # an empty folder anyone may write to is tightened too
    old = os.umask(umask)
    try:
        keygen(out, range(2))
    finally:
        os.umask(old)
    assert _mode(out) == 0o700
    files = {p.name: _mode(p) for p in out.iterdir()}
    assert set(files) == PRIVATE | PUBLIC
    assert {name: mode for name, mode in files.items() if name in PRIVATE} == dict.fromkeys(
        PRIVATE, 0o600
    )
    assert {name: mode for name, mode in files.items() if name in PUBLIC} == dict.fromkeys(
        PUBLIC, 0o644
    )


def test_keygen_never_writes_through_an_existing_file(tmp_path):
    """A file keygen would write that already exists (or a link planted in its place) is
    refused, not overwritten or followed."""
    out = tmp_path / "keys"
    out.mkdir()
    target = tmp_path / "elsewhere"
    target.write_text("untouched")
    (out / "server.key").symlink_to(target)
    with pytest.raises(FileExistsError):
        keygen(out, range(1))
    assert target.read_text() == "untouched"
