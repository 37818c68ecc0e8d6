"""The chapter 5 training examples' data, model and loaders, shared by the chapter and its solutions.

d2l has ``synthetic_data`` and ``SyntheticRegressionData`` for regression but nothing for classification,
and its classification chapters download Fashion-MNIST. ``synthetic_classification`` fills the gap: a
problem that a small MLP learns well and a linear model does not, reproducible from a seed on any device.
``make_net`` and ``make_loader`` build the model and the loaders in plain PyTorch; ``MLPClassifier`` and
``SyntheticClassificationData`` wrap them in d2l's style for its ``Trainer``. Those two subclass d2l's
classes and importing d2l takes seconds, so they are created on first use (``from d2l_ext.training import
MLPClassifier``) and ``import d2l_ext`` stays fast, as the training scripts of chapter 6 need.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


def synthetic_classification(
    num_examples: int,
    num_features: int = 32,
    num_classes: int = 10,
    *,
    clusters_per_class: int = 3,
    spread: float = 1.5,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return features (float32, ``num_examples x num_features``) and labels (int64) of a Gaussian mixture."""
    # each class owns several clusters, so the classes are not linearly separable; the clusters overlap
    # (``spread`` is the noise's standard deviation, the centres have unit variance), so no model reaches 100%
    generator = torch.Generator().manual_seed(seed)
    centres = torch.randn(num_classes * clusters_per_class, num_features, generator=generator)
    cluster = torch.randint(0, num_classes * clusters_per_class, (num_examples,), generator=generator)
    features = centres[cluster] + spread * torch.randn(num_examples, num_features, generator=generator)
    return features, cluster % num_classes


def make_net(width: int = 256, num_features: int = 32, num_classes: int = 10) -> nn.Sequential:
    """Return chapter 5's MLP (two hidden layers), on the CPU, initialised from PyTorch's global random state."""
    return nn.Sequential(nn.Linear(num_features, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                         nn.Linear(width, num_classes))


def make_loader(dataset: Dataset, train: bool, seed: int = 0, batch_size: int = 128, **options: Any) -> DataLoader:
    """Return a DataLoader of ``batch_size`` examples, shuffled (if ``train``) by a generator seeded with ``seed``."""
    return DataLoader(dataset, batch_size=batch_size, shuffle=train, generator=torch.Generator().manual_seed(seed),
                      **options)


@functools.cache
def _d2l_style_classes() -> dict[str, type]:
    """Return chapter 5's model and data in d2l's style, by name (imports d2l, which takes seconds)."""
    from d2l import torch as d2l

    class MLPClassifier(d2l.Classifier):
        """Chapter 5's MLP in d2l's style: the Trainer calls its training_step and validation_step."""

        def __init__(self, lr: float = 0.1) -> None:
            super().__init__()
            self.save_hyperparameters()
            self.net = make_net()

    class SyntheticClassificationData(d2l.DataModule):
        """Chapter 5's data in d2l's style: the first ``num_train`` examples train, the rest validate."""

        def __init__(self, features: torch.Tensor, labels: torch.Tensor, num_train: int, batch_size: int = 128):
            super().__init__()
            self.save_hyperparameters()

        def get_dataloader(self, train: bool) -> DataLoader:
            """Return the loader of the training (``train``) or the held-out examples."""
            indices = slice(0, self.num_train) if train else slice(self.num_train, None)
            return self.get_tensorloader((self.features, self.labels), train, indices)

    classes: dict[str, type] = {"MLPClassifier": MLPClassifier,
                                "SyntheticClassificationData": SyntheticClassificationData}
    for name, cls in classes.items():  # so that they print, and pickle, as d2l_ext.training.<name>
        cls.__module__, cls.__qualname__ = __name__, name
    return classes


def __getattr__(name: str) -> Any:
    """Return ``MLPClassifier`` or ``SyntheticClassificationData``, created on first use (module attribute hook)."""
    if name in ("MLPClassifier", "SyntheticClassificationData"):
        return _d2l_style_classes()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
