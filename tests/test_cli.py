"""The ``sharefl`` console script."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sharefl.cli import main


def test_help_works_as_a_console_script():
    out = subprocess.run(
        [sys.executable, "-m", "sharefl.cli", "--help"], capture_output=True, text=True, check=True
    )
    assert "usage: sharefl" in out.stdout


def test_info_json(capsys):
    assert main(["info", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["cores"] >= 1 and "cpu" in info and "cryptography" in info


def test_no_subcommand_prints_help_and_fails(capsys):
    assert main([]) == 2
    assert "usage: sharefl" in capsys.readouterr().out


def test_allocator_setting_is_applied_on_glibc():
    import platform

    from sharefl.machine import keep_freed_memory

    assert keep_freed_memory() == (platform.libc_ver()[0] == "glibc")


def test_torch_threads_sets_and_restores_the_thread_count_even_on_error():
    import torch

    from sharefl.machine import torch_threads

    before = torch.get_num_threads()
    with torch_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError), torch_threads(1):
        raise RuntimeError("the block failed")
    assert torch.get_num_threads() == before
    with torch_threads(None):
        assert torch.get_num_threads() == before


def test_info_shows_torch_and_cuda(capsys):
    import torch

    assert main(["info", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["torch"] == torch.__version__
    assert info["cuda_available"] is torch.cuda.is_available()
    assert "torch_cuda_build" in info
