"""Synthetic data for training examples that need no download.

d2l has ``synthetic_data`` and ``SyntheticRegressionData`` for regression but nothing for classification,
and its classification chapters download Fashion-MNIST. ``synthetic_classification`` fills the gap: a
problem that a small MLP learns well and a linear model does not, reproducible from a seed on any device.
"""

from __future__ import annotations

import torch


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
