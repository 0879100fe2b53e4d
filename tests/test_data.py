"""Tests for akocore.data.catalog: bundled, synthetic and user datasets; sharding."""

from __future__ import annotations

import gzip
import hashlib
import io
import pickle
import struct
import tarfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from akocore.data import bundled as data_bundled
from akocore.data import catalog as data
from akocore.data import files as data_files
from akocore.data.catalog import (
    DATASET_NAMES,
    BatchStream,
    DataError,
    epoch_batches,
    load_dataset,
)

# --------------------------------------------------------------------------
# digits


def test_digits_is_the_real_bundled_set_split_80_20():
    ds = load_dataset("digits")
    assert ds.train_x.shape[1:] == (8, 8, 1) and ds.input_shape == (8, 8, 1)
    assert ds.train_size + ds.test_size == 1797
    assert ds.test_size == 359
    assert ds.num_classes == 10
    assert ds.train_x.dtype == np.float32 and ds.train_y.dtype == np.int32
    assert 0.0 <= ds.train_x.min() and ds.train_x.max() == 1.0
    assert set(np.unique(ds.train_y)) == set(range(10))
    assert set(np.unique(ds.test_y)) == set(range(10))


def test_digits_split_is_fixed_whatever_the_run_seed():
    a, b = load_dataset("digits", seed=0), load_dataset("digits", seed=5)
    np.testing.assert_array_equal(a.test_x, b.test_x)
    np.testing.assert_array_equal(a.train_y, b.train_y)


def test_digits_falls_back_to_sklearn_loader(monkeypatch):
    direct = load_dataset("digits")
    monkeypatch.setattr(data_bundled, "_digits_csv_path", lambda: None)
    fallback = load_dataset("digits")
    np.testing.assert_array_equal(direct.train_x, fallback.train_x)
    np.testing.assert_array_equal(direct.test_y, fallback.test_y)


# --------------------------------------------------------------------------
# synthetic


def test_synthetic_has_the_requested_shapes():
    ds = load_dataset(
        "synthetic", train_size=50, test_size=20, input_shape=(6, 5, 2), num_classes=3
    )
    assert ds.train_x.shape == (50, 6, 5, 2) and ds.test_x.shape == (20, 6, 5, 2)
    assert ds.train_y.shape == (50,) and ds.input_shape == (6, 5, 2)
    assert ds.num_classes == 3 and ds.train_y.max() < 3
    assert ds.train_x.dtype == np.float32 and ds.train_y.dtype == np.int32


def test_synthetic_default_shape_is_cifar_like():
    ds = load_dataset("synthetic", train_size=8, test_size=8)
    assert ds.input_shape == (32, 32, 3) and ds.num_classes == 10


def test_synthetic_is_deterministic_by_seed():
    a = load_dataset("synthetic", seed=1, train_size=30, test_size=10, input_shape=(4, 4, 1))
    b = load_dataset("synthetic", seed=1, train_size=30, test_size=10, input_shape=(4, 4, 1))
    c = load_dataset("synthetic", seed=2, train_size=30, test_size=10, input_shape=(4, 4, 1))
    np.testing.assert_array_equal(a.train_x, b.train_x)
    np.testing.assert_array_equal(a.test_y, b.test_y)
    assert not np.array_equal(a.train_x, c.train_x)


def test_synthetic_is_learnable_from_class_means():
    ds = load_dataset("synthetic", train_size=2000, test_size=500, input_shape=(16, 16, 3))
    flat_train = ds.train_x.reshape(ds.train_size, -1)
    means = np.stack([flat_train[ds.train_y == c].mean(0) for c in range(10)])
    flat_test = ds.test_x.reshape(ds.test_size, -1)
    distances = ((flat_test[:, None, :] - means[None]) ** 2).sum(-1)
    assert (distances.argmin(1) == ds.test_y).mean() > 0.9


def test_synthetic_bad_sizes_are_refused():
    with pytest.raises(DataError, match="train_size"):
        load_dataset("synthetic", train_size=0)


def test_unknown_dataset_and_option_are_refused():
    with pytest.raises(ValueError, match="digits, synthetic, cifar10, mnist"):
        load_dataset("imagenet")
    with pytest.raises(ValueError, match="train_size"):
        load_dataset("synthetic", size=3)
    assert DATASET_NAMES == ("digits", "synthetic", "cifar10", "mnist")


# --------------------------------------------------------------------------
# cifar10


def _cifar_batch(count: int, start_label: int) -> tuple[bytes, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(start_label)
    images = rng.integers(0, 256, size=(count, 32, 32, 3), dtype=np.uint8)
    labels = [(start_label + i) % 10 for i in range(count)]
    rows = images.transpose(0, 3, 1, 2).reshape(count, 3072)  # 1024 R, 1024 G, 1024 B
    batch = {b"batch_label": b"test", b"data": rows, b"labels": labels, b"filenames": []}
    return pickle.dumps(batch, protocol=2), images, np.asarray(labels)


def _make_cifar(tmp_path: Path, per_batch: int = 20) -> tuple[Path, dict]:
    """A cifar-10-python.tar.gz in the real layout; returns it and the raw contents."""
    members = {}
    for i, member in enumerate([*data_files.CIFAR10_TRAIN_MEMBERS, data_files.CIFAR10_TEST_MEMBER]):
        members[member] = _cifar_batch(per_batch, start_label=i)
    archive = tmp_path / "cifar-10-python.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for member, (raw, _, _) in members.items():
            info = tarfile.TarInfo(f"cifar-10-batches-py/{member}")
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))
    return archive, members


def test_cifar10_archive_with_unknown_md5_is_refused_before_unpickling(tmp_path, monkeypatch):
    archive, _ = _make_cifar(tmp_path)

    def no_unpickling(*args, **kwargs):
        raise AssertionError("unverified bytes were unpickled")

    monkeypatch.setattr(pickle, "loads", no_unpickling)
    monkeypatch.setattr(pickle, "load", no_unpickling)
    with pytest.raises(DataError, match="md5.*trust_data"):
        load_dataset("cifar10", path=str(archive))


def test_cifar10_trusted_archive_round_trips_shapes_values_and_labels(tmp_path):
    archive, members = _make_cifar(tmp_path)
    ds = load_dataset("cifar10", path=str(archive), trust_data=True)
    assert ds.train_x.shape == (100, 32, 32, 3) and ds.test_x.shape == (20, 32, 32, 3)
    assert ds.input_shape == (32, 32, 3) and ds.num_classes == 10
    train_images = np.concatenate([members[m][1] for m in data_files.CIFAR10_TRAIN_MEMBERS])
    train_labels = np.concatenate([members[m][2] for m in data_files.CIFAR10_TRAIN_MEMBERS])
    np.testing.assert_allclose(ds.train_x, train_images / 255.0, atol=1e-7)
    np.testing.assert_array_equal(ds.train_y, train_labels)
    np.testing.assert_array_equal(ds.test_y, members["test_batch"][2])
    assert ds.train_x.dtype == np.float32 and ds.train_y.dtype == np.int32


def test_cifar10_channel_order_is_nhwc_rgb(tmp_path):
    archive, members = _make_cifar(tmp_path)
    raw_rows = pickle.loads(members["data_batch_1"][0], encoding="bytes")[b"data"]
    ds = load_dataset("cifar10", path=str(archive), trust_data=True)
    row, col = 1, 2  # pixel (1, 2): R at 0*1024 + 1*32 + 2, G at 1024 + 34, B at 2048 + 34
    expected = [raw_rows[0, c * 1024 + row * 32 + col] / 255.0 for c in range(3)]
    np.testing.assert_allclose(ds.train_x[0, row, col], expected, atol=1e-7)


def test_cifar10_archive_matching_the_md5_table_is_accepted(tmp_path, monkeypatch):
    archive, members = _make_cifar(tmp_path)
    table = {member: hashlib.md5(raw).hexdigest() for member, (raw, _, _) in members.items()}
    monkeypatch.setattr(data_files, "CIFAR10_MD5", table)
    ds = load_dataset("cifar10", path=str(archive))
    assert ds.train_size == 100 and ds.test_size == 20


def test_cifar10_extracted_folder_is_accepted_and_verified(tmp_path):
    archive, _ = _make_cifar(tmp_path)
    with tarfile.open(archive, "r:gz") as tar:
        tar.extractall(tmp_path / "out", filter="data")
    with pytest.raises(DataError, match="md5"):
        load_dataset("cifar10", path=str(tmp_path / "out"))
    ds = load_dataset("cifar10", path=str(tmp_path / "out"), trust_data=True)
    assert ds.train_size == 100


def test_cifar10_needs_a_path(tmp_path):
    with pytest.raises(DataError, match="cifar-10-python.tar.gz"):
        load_dataset("cifar10")
    with pytest.raises(DataError, match="does not exist"):
        load_dataset("cifar10", path=str(tmp_path / "nope.tar.gz"))


def test_cifar10_bad_archive_is_a_data_error(tmp_path):
    not_tar = tmp_path / "junk.tar.gz"
    not_tar.write_bytes(b"this is not a tarball")
    with pytest.raises(DataError, match="not a readable .tar.gz"):
        load_dataset("cifar10", path=str(not_tar))
    empty = tmp_path / "empty.tar.gz"
    with tarfile.open(empty, "w:gz"):
        pass
    with pytest.raises(DataError, match="no member cifar-10-batches-py/data_batch_1"):
        load_dataset("cifar10", path=str(empty))


def test_cifar10_trusted_member_with_wrong_content_is_a_data_error(tmp_path):
    archive = tmp_path / "wrong.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for member in [*data_files.CIFAR10_TRAIN_MEMBERS, data_files.CIFAR10_TEST_MEMBER]:
            raw = pickle.dumps({b"data": np.zeros((2, 10), np.uint8), b"labels": [0, 1]})
            info = tarfile.TarInfo(f"cifar-10-batches-py/{member}")
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))
    with pytest.raises(DataError, match=r"expected \(N, 3072\)"):
        load_dataset("cifar10", path=str(archive), trust_data=True)


# --------------------------------------------------------------------------
# mnist


def _idx(array: np.ndarray, magic: int | None = None) -> bytes:
    magic = magic if magic is not None else 0x0800 | array.ndim
    header = struct.pack(">I", magic) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.astype(np.uint8).tobytes()


def _make_mnist(folder: Path, *, compress: bool, train: int = 12, test: int = 5) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    arrays = {
        "train-images-idx3-ubyte": rng.integers(0, 256, (train, 28, 28), dtype=np.uint8),
        "train-labels-idx1-ubyte": rng.integers(0, 10, train, dtype=np.uint8),
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (test, 28, 28), dtype=np.uint8),
        "t10k-labels-idx1-ubyte": rng.integers(0, 10, test, dtype=np.uint8),
    }
    for stem, array in arrays.items():
        raw = _idx(array)
        if compress:
            (folder / f"{stem}.gz").write_bytes(gzip.compress(raw))
        else:
            (folder / stem).write_bytes(raw)
    return arrays


@pytest.mark.parametrize("compress", [False, True])
def test_mnist_idx_files_load_plain_and_gzipped(tmp_path, compress):
    arrays = _make_mnist(tmp_path / "mnist", compress=compress)
    ds = load_dataset("mnist", path=str(tmp_path / "mnist"))
    assert ds.train_x.shape == (12, 28, 28, 1) and ds.test_x.shape == (5, 28, 28, 1)
    assert ds.input_shape == (28, 28, 1) and ds.num_classes == 10
    np.testing.assert_allclose(
        ds.train_x[..., 0], arrays["train-images-idx3-ubyte"] / 255.0, atol=1e-7
    )
    np.testing.assert_array_equal(ds.test_y, arrays["t10k-labels-idx1-ubyte"])
    assert ds.train_y.dtype == np.int32


def test_mnist_bad_magic_number_is_a_clear_error(tmp_path):
    folder = tmp_path / "mnist"
    arrays = _make_mnist(folder, compress=False)
    (folder / "train-images-idx3-ubyte").write_bytes(
        _idx(arrays["train-images-idx3-ubyte"], magic=0x0801)
    )
    with pytest.raises(DataError, match="magic number 0x00000801, expected 0x00000803"):
        load_dataset("mnist", path=str(folder))


def test_mnist_truncated_file_and_count_mismatch_are_errors(tmp_path):
    folder = tmp_path / "mnist"
    _make_mnist(folder, compress=False)
    file = folder / "t10k-images-idx3-ubyte"
    file.write_bytes(file.read_bytes()[:-3])
    with pytest.raises(DataError, match="header"):
        load_dataset("mnist", path=str(folder))
    other = tmp_path / "other"
    _make_mnist(other, compress=False)
    (other / "t10k-labels-idx1-ubyte").write_bytes(_idx(np.zeros(4, np.uint8)))
    with pytest.raises(DataError, match="5 images but 4 labels"):
        load_dataset("mnist", path=str(other))


def test_mnist_missing_path_or_file_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match="train-images-idx3-ubyte"):
        load_dataset("mnist")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="neither train-images-idx3-ubyte nor"):
        load_dataset("mnist", path=str(tmp_path / "empty"))


# --------------------------------------------------------------------------
# sharding


def test_epoch_batches_shape_and_static_batch_size():
    batches = epoch_batches(103, worker=1, workers=2, epoch=0, batch_size=10, seed=0)
    assert batches.shape == (5, 10)  # shard of 51 examples -> 5 full batches


def test_shards_of_one_epoch_are_disjoint_and_cover_the_data():
    shards = [
        epoch_batches(120, worker=w, workers=3, epoch=4, batch_size=8, seed=9) for w in range(3)
    ]
    together = np.concatenate([s.ravel() for s in shards])
    assert len(set(together.tolist())) == together.size == 120
    assert sorted(together.tolist()) == list(range(120))


@settings(max_examples=40, deadline=None)
@given(
    size=st.integers(1, 300),
    workers=st.integers(1, 6),
    batch_size=st.integers(1, 20),
    epoch=st.integers(0, 5),
    seed=st.integers(0, 2**31),
)
def test_shards_are_disjoint_and_equal_for_any_sizes(size, workers, batch_size, epoch, seed):
    shards = [
        epoch_batches(
            size, worker=w, workers=workers, epoch=epoch, batch_size=batch_size, seed=seed
        )
        for w in range(workers)
    ]
    together = np.concatenate([s.ravel() for s in shards])
    assert len(set(together.tolist())) == together.size
    assert all(s.shape == shards[0].shape for s in shards)
    assert together.size == workers * ((size // workers) // batch_size) * batch_size


def test_epoch_batches_are_deterministic_and_differ_by_epoch_and_seed():
    kwargs = dict(worker=0, workers=2, batch_size=4)
    a = epoch_batches(64, epoch=0, seed=1, **kwargs)
    np.testing.assert_array_equal(a, epoch_batches(64, epoch=0, seed=1, **kwargs))
    assert not np.array_equal(a, epoch_batches(64, epoch=1, seed=1, **kwargs))
    assert not np.array_equal(a, epoch_batches(64, epoch=0, seed=2, **kwargs))


def test_epoch_batches_refuses_a_bad_worker_index():
    with pytest.raises(ValueError, match="worker"):
        epoch_batches(10, worker=2, workers=2, epoch=0, batch_size=1, seed=0)


def _tiny_dataset(size: int = 30) -> data.Dataset:
    x = np.arange(size, dtype=np.float32).reshape(size, 1)
    y = (np.arange(size) % 3).astype(np.int32)
    return data.Dataset("tiny", x, y, x[:5], y[:5], 3, (1,))


def test_batch_stream_moves_across_epochs_and_gathers_the_indexed_examples():
    ds = _tiny_dataset()
    stream = BatchStream(ds, worker=1, workers=2, batch_size=4, seed=3)
    assert stream.steps_per_epoch == 3  # 15 examples per worker -> 3 batches of 4
    seen = [stream.next() for _ in range(7)]
    assert [(b.epoch, b.index) for b in seen] == [
        (0, 0),
        (0, 1),
        (0, 2),
        (1, 0),
        (1, 1),
        (1, 2),
        (2, 0),
    ]
    assert [b.step for b in seen] == list(range(7))
    expected = epoch_batches(30, worker=1, workers=2, epoch=1, batch_size=4, seed=3)[1]
    np.testing.assert_array_equal(seen[4].x[:, 0], expected.astype(np.float32))
    np.testing.assert_array_equal(seen[4].y, expected % 3)
    assert seen[0].x.shape == (4, 1)


def test_batch_stream_is_deterministic_and_skip_matches_consuming():
    ds = _tiny_dataset()
    a = BatchStream(ds, 0, 2, 4, seed=5)
    b = BatchStream(ds, 0, 2, 4, seed=5)
    for _ in range(4):
        np.testing.assert_array_equal(next(a).x, b.next().x)
    b.skip(5)
    for _ in range(5):
        a.next()
    assert a.step == b.step == 9
    np.testing.assert_array_equal(a.next().x, b.next().x)


def test_batch_stream_refuses_a_dataset_too_small_for_one_batch():
    with pytest.raises(ValueError, match="too few"):
        BatchStream(_tiny_dataset(10), worker=0, workers=4, batch_size=4, seed=0)
