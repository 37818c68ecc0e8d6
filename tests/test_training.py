"""d2l_ext.training: the synthetic classification data is reproducible, balanced enough, and learnable."""

import torch
from torch import nn

from d2l_ext.training import synthetic_classification


def test_shapes_dtypes_and_label_range():
    features, labels = synthetic_classification(500, num_features=8, num_classes=4)
    assert features.shape == (500, 8) and features.dtype == torch.float32
    assert labels.shape == (500,) and labels.dtype == torch.int64
    assert labels.min() >= 0 and labels.max() <= 3


def test_same_seed_same_data_other_seed_other_data():
    first, second = synthetic_classification(100, seed=3), synthetic_classification(100, seed=3)
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])
    assert not torch.equal(first[0], synthetic_classification(100, seed=4)[0])


def test_does_not_touch_the_global_random_state():
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    synthetic_classification(100)
    assert torch.equal(torch.rand(3), expected)


def test_every_class_is_present():
    _, labels = synthetic_classification(2000)
    counts = torch.bincount(labels, minlength=10)
    assert counts.min() > 2000 / 10 / 3


def test_an_mlp_beats_a_linear_model_on_held_out_data():
    features, labels = synthetic_classification(3000, num_features=8, num_classes=3, spread=0.5)
    train, held_out = slice(0, 2000), slice(2000, None)

    def held_out_accuracy(net: nn.Module) -> float:
        torch.manual_seed(0)
        optimizer = torch.optim.Adam(net.parameters(), lr=0.01)
        for _ in range(100):  # full-batch steps
            loss = nn.functional.cross_entropy(net(features[train]), labels[train])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        with torch.no_grad():
            return (net(features[held_out]).argmax(1) == labels[held_out]).float().mean().item()

    torch.manual_seed(0)
    linear = held_out_accuracy(nn.Linear(8, 3))
    mlp = held_out_accuracy(nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 3)))
    assert mlp > 0.85 and mlp > linear + 0.1
