"""Datasets read from files the user supplies: cifar10 and mnist.

- ``cifar10``: the user's ``cifar-10-python.tar.gz`` (or its extracted
  ``cifar-10-batches-py`` folder). Batches are Python pickles; each member's
  md5 is checked against the published one *before* unpickling, because
  unpickling runs arbitrary code. `trust_data=True` opts in to other archives
  in the same format.
- ``mnist``: the user's IDX files (optionally gzipped), parsed with struct
  and NumPy (no pickle).

Reading these files is the only I/O of akocore's data; errors a user can act
on are raised as `DataError`.
"""

from __future__ import annotations

import gzip
import hashlib
import math
import pickle
import struct
import tarfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from akocore.data.dataset import DataError, Dataset, make_dataset

# --------------------------------------------------------------------------
# cifar10 (user-supplied "python version" archive)

CIFAR10_FOLDER = "cifar-10-batches-py"
CIFAR10_TRAIN_MEMBERS = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR10_TEST_MEMBER = "test_batch"
# published per-file md5s (as in torchvision's loader)
CIFAR10_MD5: dict[str, str] = {
    "data_batch_1": "c99cafc152244af753f735de768cd75f",
    "data_batch_2": "d4bba439e000b95fd0a9bffe97cbabec",
    "data_batch_3": "54ebc095f3ab1f0389bbae665268c751",
    "data_batch_4": "634d18415352ddfa80567beed471001a",
    "data_batch_5": "482c414d41f54cd18b22e5b47cb7c3cb",
    "test_batch": "40351d587109b95175f43aff81a1287e",
}
CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"


def load_cifar10(path: str | None, *, trust_data: bool = False) -> Dataset:
    if path is None:
        raise DataError(
            f"cifar10 needs path= pointing at cifar-10-python.tar.gz (from {CIFAR10_URL})"
        )
    source = Path(path)
    if not source.exists():
        raise DataError(f"cifar10: {path} does not exist; expected cifar-10-python.tar.gz")
    if source.is_dir():
        folder = source / CIFAR10_FOLDER if (source / CIFAR10_FOLDER).is_dir() else source

        def read_dir(member: str) -> bytes:
            file = folder / member
            if not file.is_file():
                raise DataError(f"cifar10: {file} is missing; expected the {CIFAR10_FOLDER} files")
            return file.read_bytes()

        return _cifar10_from(read_dir, str(source), trust_data)
    try:
        archive = tarfile.open(source, "r:gz")
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise DataError(
            f"cifar10: {path} is not a readable .tar.gz ({exc}); expected cifar-10-python.tar.gz"
        ) from None
    with archive:

        def read_tar(member: str) -> bytes:
            name = f"{CIFAR10_FOLDER}/{member}"
            try:
                info = archive.getmember(name)
            except KeyError:
                raise DataError(f"cifar10: {path} has no member {name}") from None
            handle = archive.extractfile(info)
            if handle is None:
                raise DataError(f"cifar10: member {name} of {path} is not a regular file")
            try:
                return handle.read()
            except (tarfile.TarError, OSError, EOFError) as exc:
                raise DataError(f"cifar10: cannot read {name} from {path} ({exc})") from None

        return _cifar10_from(read_tar, str(source), trust_data)


def _cifar10_from(read: Callable[[str], bytes], where: str, trust_data: bool) -> Dataset:
    train = [_cifar10_batch(read(m), m, where, trust_data) for m in CIFAR10_TRAIN_MEMBERS]
    test_x, test_y = _cifar10_batch(
        read(CIFAR10_TEST_MEMBER), CIFAR10_TEST_MEMBER, where, trust_data
    )
    train_x = np.concatenate([x for x, _ in train])
    train_y = np.concatenate([y for _, y in train])
    return make_dataset("cifar10", train_x, train_y, test_x, test_y, 10)


def _cifar10_batch(
    raw: bytes, member: str, where: str, trust_data: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Verify, unpickle and decode one batch into NHWC float32 [0, 1] and int32 labels."""
    digest = hashlib.md5(raw).hexdigest()
    expected = CIFAR10_MD5[member]
    if digest != expected and not trust_data:
        raise DataError(
            f"cifar10: {member} in {where} has md5 {digest}, expected {expected}; refusing to "
            "unpickle unverified data (pass trust_data=True only for your own archive)"
        )
    try:
        batch = pickle.loads(raw, encoding="bytes")
        data = np.asarray(batch[b"data"], dtype=np.uint8)
        labels = np.asarray(batch[b"labels"], dtype=np.int64)
    except Exception as exc:  # a bad pickle can raise almost anything
        raise DataError(
            f"cifar10: {member} in {where} is not a CIFAR-10 batch "
            f"(a pickled dict with b'data' and b'labels'): {exc!r}"
        ) from None
    if data.ndim != 2 or data.shape[1] != 3072 or labels.shape != (data.shape[0],):
        raise DataError(
            f"cifar10: {member} in {where} has data {data.shape} and labels {labels.shape}; "
            "expected (N, 3072) uint8 and N labels"
        )
    if labels.size and (labels.min() < 0 or labels.max() > 9):
        raise DataError(f"cifar10: {member} in {where} has labels outside 0..9")
    images = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1).astype(np.float32)
    images /= np.float32(255.0)
    return images, labels.astype(np.int32)


# --------------------------------------------------------------------------
# mnist (user-supplied IDX files)

MNIST_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
IDX_IMAGES_MAGIC = 0x00000803  # unsigned bytes, 3 dimensions
IDX_LABELS_MAGIC = 0x00000801  # unsigned bytes, 1 dimension


def load_mnist(path: str | None) -> Dataset:
    if path is None:
        raise DataError(
            "mnist needs path= pointing at a directory with train-images-idx3-ubyte, "
            "train-labels-idx1-ubyte, t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte (or .gz)"
        )
    folder = Path(path)
    if not folder.is_dir():
        raise DataError(f"mnist: {path} is not a directory; expected one holding the IDX files")
    train_x = _read_idx(_find_idx(folder, MNIST_FILES["train_images"]), IDX_IMAGES_MAGIC)
    train_y = _read_idx(_find_idx(folder, MNIST_FILES["train_labels"]), IDX_LABELS_MAGIC)
    test_x = _read_idx(_find_idx(folder, MNIST_FILES["test_images"]), IDX_IMAGES_MAGIC)
    test_y = _read_idx(_find_idx(folder, MNIST_FILES["test_labels"]), IDX_LABELS_MAGIC)
    for split, images, labels in (("train", train_x, train_y), ("t10k", test_x, test_y)):
        if images.shape[0] != labels.shape[0]:
            raise DataError(
                f"mnist: {split} has {images.shape[0]} images but "
                f"{labels.shape[0]} labels in {path}"
            )
        if labels.size and labels.max() > 9:
            raise DataError(f"mnist: {split} labels in {path} go above 9")

    def scale(images: np.ndarray) -> np.ndarray:
        x = images.astype(np.float32)[..., np.newaxis]
        x /= np.float32(255.0)
        return x

    return make_dataset("mnist", scale(train_x), train_y, scale(test_x), test_y, 10)


def _find_idx(folder: Path, stem: str) -> Path:
    for candidate in (folder / stem, folder / f"{stem}.gz"):
        if candidate.is_file():
            return candidate
    raise DataError(f"mnist: {folder} has neither {stem} nor {stem}.gz")


def _read_idx(file: Path, expected_magic: int) -> np.ndarray:
    """An IDX file of unsigned bytes as a uint8 array, magic number and size checked."""
    try:
        raw = file.read_bytes()
        if file.suffix == ".gz":
            raw = gzip.decompress(raw)
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise DataError(f"mnist: cannot read {file} ({exc})") from None
    if len(raw) < 4:
        raise DataError(f"mnist: {file} is {len(raw)} bytes, too short for an IDX header")
    (magic,) = struct.unpack(">I", raw[:4])
    if magic != expected_magic:
        raise DataError(
            f"mnist: {file} has magic number 0x{magic:08x}, expected 0x{expected_magic:08x} "
            "(IDX unsigned-byte file)"
        )
    ndim = magic & 0xFF
    header_bytes = 4 + 4 * ndim
    if len(raw) < header_bytes:
        raise DataError(f"mnist: {file} is truncated inside its IDX header")
    dims = struct.unpack(f">{ndim}I", raw[4:header_bytes])
    expected_bytes = header_bytes + math.prod(dims)
    if len(raw) != expected_bytes:
        raise DataError(
            f"mnist: {file} is {len(raw)} bytes; its header {dims} says {expected_bytes}"
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header_bytes).reshape(dims)
