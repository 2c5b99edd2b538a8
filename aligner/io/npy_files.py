"""Plain .npy (one tensor, named by the file stem) and .npz readers; never unpickle."""
from __future__ import annotations

import os
import zipfile

import numpy as np

from aligner.core.errors import AlignerError
from aligner.io.base import ArraySource


def load_npy(path: str) -> np.ndarray:
    """np.load (memory-mapped) without pickles; one clear error for pickled, truncated or corrupted files."""
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except ValueError as exc:
        if "pickle" in str(exc).lower():
            raise AlignerError(f"{path}: holds pickled objects; refusing to load it (aligner never unpickles .npy)") \
                from None
        raise AlignerError(f"{path}: not a readable .npy file (truncated or corrupted?): {exc}") from None
    except (OSError, EOFError) as exc:
        raise AlignerError(f"{path}: not a readable .npy file: {exc}") from None


def open_npy(path: str) -> ArraySource:
    """A single .npy file (one tensor named by the file stem, memory-mapped) or an .npz archive."""
    if not path.endswith(".npz"):
        source = ArraySource(path, None, {os.path.splitext(os.path.basename(path))[0]: load_npy(path)})
        source.file_backed = True
        return source
    try:
        with np.load(path, allow_pickle=False) as archive:
            return ArraySource(path, None, {k: archive[k] for k in archive.files})
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as exc:
        raise AlignerError(f"{path}: not a readable .npz archive: {exc}") from None
