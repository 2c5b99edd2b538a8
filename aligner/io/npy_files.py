"""Plain .npy (one tensor, named by the file stem) and .npz readers; never unpickle."""
from __future__ import annotations

import os
import zipfile

import numpy as np

from aligner.dtypes import canonical
from aligner.errors import AlignerError
from aligner.io.base import TensorInfo, TensorSource


def load_npy(path: str, mmap: bool = True) -> np.ndarray:
    """np.load without pickles; one clear error for pickled, truncated or corrupted files."""
    try:
        return np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except ValueError as exc:
        if "pickle" in str(exc).lower():
            raise AlignerError(f"{path}: holds pickled objects; refusing to load it (aligner never unpickles .npy)") \
                from None
        raise AlignerError(f"{path}: not a readable .npy file (truncated or corrupted?): {exc}") from None
    except (OSError, EOFError) as exc:
        raise AlignerError(f"{path}: not a readable .npy file: {exc}") from None


class NpySource(TensorSource):
    """A single .npy file or an .npz archive."""

    format = "npy"

    def __init__(self, path: str) -> None:
        super().__init__(path, None)
        if path.endswith(".npz"):
            try:
                with np.load(path, allow_pickle=False) as archive:
                    self._arrays = {k: archive[k] for k in archive.files}
            except (ValueError, OSError, zipfile.BadZipFile, EOFError) as exc:
                raise AlignerError(f"{path}: not a readable .npz archive: {exc}") from None
        else:
            self._arrays = {os.path.splitext(os.path.basename(path))[0]: load_npy(path)}
            self.file_backed = True
        for name, array in self._arrays.items():
            self.infos[name] = TensorInfo(tuple(array.shape), canonical(array.dtype))

    def _load(self, name: str) -> np.ndarray:
        return self._arrays[name]
