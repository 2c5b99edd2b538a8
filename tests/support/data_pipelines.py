"""Real input pipelines for the `align data` tests: a folder of generated PNG images (PIL) read by torchvision
(ImageFolder + transforms + DataLoader) and by mindspore.dataset (ImageFolderDataset + vision), and a small text
set tokenised on each side; each builder takes the one bug a test injects."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np

from tests.zoo import torch_compat  # noqa: F401  (torchvision op schemas before torchvision)

CLASSES = ("cat", "dog", "fox", "owl")
PER_CLASS = 50          # 200 images
SIZE = 36               # stored size; both pipelines centre-crop to CROP
CROP = 32
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
BATCH = 32              # 200 samples: 6 full batches and one of 8


def make_images(root: Path, per_class: int = PER_CLASS, size: int = SIZE) -> Path:
    """A folder of smooth, asymmetric generated RGB images (a gradient, a disc and a bar per image), one sub-folder
    per class, as ImageFolder readers expect."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:size, 0:size] / size
    for c, name in enumerate(CLASSES):
        (root / name).mkdir(parents=True, exist_ok=True)
        for k in range(per_class):
            base = rng.uniform(30, 200, 3)
            slope = rng.uniform(-60, 60, (2, 3))
            pixels = base + xx[..., None] * slope[0] + yy[..., None] * slope[1]
            img = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
            draw = ImageDraw.Draw(img)
            x0, y0 = rng.integers(2, size // 2, 2)
            draw.ellipse([int(x0), int(y0), int(x0) + size // 3, int(y0) + size // 4],
                         fill=tuple(int(v) for v in rng.integers(0, 255, 3)))
            draw.rectangle([1, 2 + c * 3, size // 2, 4 + c * 3], fill=(250, 20 * c, 10))
            img.save(root / name / f"{k:03d}.png")
    return root


def torch_images(root: Path, *, resize: int | None = None, shuffle: bool = False, seed: int = 0,
                 drop_last: bool = False, batch: int = BATCH, sampler: Any = None, normalize: bool = True,
                 to_tensor: bool = True, nearest: bool = False) -> Any:
    """The reference: torchvision ImageFolder, CenterCrop (or Resize), ToTensor, Normalize; a DataLoader."""
    import torch
    import torchvision.transforms as tvt
    from torchvision.datasets import ImageFolder

    mode = tvt.InterpolationMode.NEAREST if nearest else tvt.InterpolationMode.BILINEAR
    steps: list[Any] = [tvt.Resize((resize, resize), mode) if resize else tvt.CenterCrop(CROP)]
    if to_tensor:
        steps.append(tvt.ToTensor())
    if normalize:
        steps.append(tvt.Normalize(MEAN, STD))
    if not to_tensor:
        steps.append(tvt.PILToTensor())
    data = ImageFolder(str(root), transform=tvt.Compose(steps))
    generator = torch.Generator().manual_seed(seed) if shuffle else None
    return torch.utils.data.DataLoader(data, batch_size=batch, shuffle=shuffle and sampler is None,
                                       generator=generator, drop_last=drop_last, sampler=sampler)


def ms_images(root: Path, *, bug: str | None = None, shuffle: bool = False, batch: int = BATCH,
              drop_remainder: bool = False, num_shards: int | None = None, shard_id: int | None = None,
              resize: int | None = None, class_indexing: dict[str, int] | None = None, seed: int = 0) -> Any:
    """The port: mindspore.dataset ImageFolderDataset, vision CenterCrop (or Resize), Rescale, Normalize, HWC2CHW,
    batch; `bug` names the one mistake to make."""
    import mindspore.dataset as ds
    import mindspore.dataset.transforms as transforms
    import mindspore.dataset.vision as vision

    ds.config.set_seed(seed)
    data = ds.ImageFolderDataset(str(root), decode=True, shuffle=shuffle, num_shards=num_shards, shard_id=shard_id,
                                 class_indexing=class_indexing or {n: i for i, n in enumerate(CLASSES)})
    crop = vision.Resize((resize, resize), vision.Inter.BILINEAR) if resize else vision.CenterCrop(
        CROP - 4 if bug == "size" else CROP)
    steps: list[Any] = [crop]
    if bug == "bgr":
        steps.append(vision.ConvertColor(vision.ConvertMode.COLOR_RGB2BGR))
    if bug == "flip":
        steps.append(vision.RandomHorizontalFlip(0.5))
    raw = bug in ("range", "uint8", "float")   # no scaling, no normalisation
    if not raw:
        steps.append(vision.Rescale(1.0 / 255, 0.0))
    if not raw and bug != "no-normalize":
        steps.append(vision.Normalize((0.5, 0.5, 0.5), (0.25, 0.25, 0.25)) if bug == "constants"
                     else vision.Normalize(MEAN, STD))
    if bug == "twice":
        steps.append(vision.Normalize(MEAN, STD))
    if bug != "hwc":
        steps.append(vision.HWC2CHW())
    if bug == "float":
        steps.append(transforms.TypeCast(np.float32))
    data = data.map(steps, input_columns="image")
    if bug == "offset":
        data = data.map(lambda label: (label + 1).astype(np.int32), input_columns="label")
    if bug == "merge":   # two classes folded into one id
        data = data.map(lambda label: (label // 2).astype(np.int32), input_columns="label")
    if bug == "float-label":
        data = data.map(transforms.TypeCast(np.float32), input_columns="label")
    if bug == "one-hot":
        data = data.map(transforms.OneHot(len(CLASSES)), input_columns="label")
    return data.batch(batch, drop_remainder=drop_remainder)


WORDS = ("the quick brown fox jumps over a lazy dog while seven small owls watch from old trees near quiet "
         "rivers and every cat sleeps").split()
MAX_LEN = 16


def make_sentences(n: int = 96) -> list[str]:
    """Sentences of 4 to 22 words (some longer than MAX_LEN: truncation matters)."""
    rng = np.random.default_rng(1)
    return [" ".join(rng.choice(WORDS, int(rng.integers(4, 23)))) for _ in range(n)]


def vocab() -> dict[str, int]:
    """Word -> id; 0 is the pad token, 1 unknown."""
    return {"<pad>": 0, "<unk>": 1} | {w: i + 2 for i, w in enumerate(sorted(set(WORDS)))}


def torch_text(sentences: Sequence[str], *, side: str = "right", pad: int = 0, max_len: int = MAX_LEN,
               batch: int = 16) -> Any:
    """The reference: a torch Dataset of token ids (whitespace split, vocabulary lookup, truncation), padded by the
    collate function to `max_len` on `side` with `pad`; batches of {"ids", "label"}."""
    import torch

    table = vocab()

    class Sentences(torch.utils.data.Dataset):  # type: ignore[type-arg]
        def __len__(self) -> int:
            return len(sentences)

        def __getitem__(self, i: int) -> tuple[Any, int]:
            ids = [table.get(w, 1) for w in sentences[i].split()][:max_len]
            return torch.tensor(ids, dtype=torch.int64), i % 3

    def collate(items: list[tuple[Any, int]]) -> dict[str, Any]:
        rows = []
        for ids, _ in items:
            fill = torch.full((MAX_LEN - len(ids),), pad, dtype=torch.int64)
            rows.append(torch.cat([ids, fill]) if side == "right" else torch.cat([fill, ids]))
        return {"ids": torch.stack(rows), "label": torch.tensor([label for _, label in items])}

    return torch.utils.data.DataLoader(Sentences(), batch_size=batch, collate_fn=collate)


def ms_text(sentences: Sequence[str], *, max_len: int = MAX_LEN, pad: int = 0, batch: int = 16,
            pad_to: int = MAX_LEN, missing_word: str | None = None, special: bool = False) -> Any:
    """The port: mindspore.dataset.text WhitespaceTokenizer, Lookup, Truncate, PadEnd; batches of ids and label
    (`missing_word`: left out of the vocabulary, so it becomes <unk>)."""
    import mindspore.dataset as ds
    import mindspore.dataset.text as text
    import mindspore.dataset.transforms as transforms

    table = text.Vocab.from_dict({w: i for w, i in vocab().items() if w != missing_word})
    data = ds.NumpySlicesDataset({"ids": np.array(list(sentences)), "label": np.arange(len(sentences)) % 3},
                                 shuffle=False)
    steps = [text.WhitespaceTokenizer(), text.Lookup(table, "<unk>")]
    if special:  # [CLS] ... [SEP] around every sentence (ids past the vocabulary)
        steps.append(transforms.Concatenate(prepend=np.array([100], np.int32), append=np.array([101], np.int32)))
    steps += [text.Truncate(max_len), transforms.PadEnd([pad_to], pad_value=pad)]
    data = data.map(steps, input_columns="ids")
    return data.batch(batch)
