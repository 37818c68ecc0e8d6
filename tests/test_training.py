"""d2l_ext.training: the synthetic data is reproducible and learnable; the model, loaders and d2l classes work."""

import subprocess
import sys

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from d2l_ext import training
from d2l_ext.training import make_loader, make_net, synthetic_classification

READS_NOTEBOOKS = False  # no notebook, edition or markdown file: tools/result_cache.py keys it on code only


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


def test_make_net_maps_features_to_class_scores_and_follows_the_global_seed():
    torch.manual_seed(0)
    net = make_net()
    assert net(torch.zeros(5, 32)).shape == (5, 10)
    assert sum(p.numel() for p in net.parameters()) == 32 * 256 + 256 + 256 * 256 + 256 + 256 * 10 + 10
    torch.manual_seed(0)
    assert torch.equal(make_net().state_dict()["0.weight"], net.state_dict()["0.weight"])
    assert make_net(width=8, num_features=3, num_classes=2)(torch.zeros(1, 3)).shape == (1, 2)


def test_make_loader_shuffles_reproducibly_for_training_only():
    dataset = TensorDataset(torch.arange(300.0))

    def first_batch(**kwargs):
        return next(iter(make_loader(dataset, **kwargs)))[0]

    assert len(make_loader(dataset, train=True)) == 3  # batches of 128: 128, 128, 44
    assert torch.equal(first_batch(train=False), torch.arange(128.0))
    assert torch.equal(first_batch(train=True), first_batch(train=True, seed=0))
    assert not torch.equal(first_batch(train=True), first_batch(train=True, seed=1))
    assert not torch.equal(first_batch(train=True), torch.arange(128.0))
    assert len(first_batch(train=False, batch_size=50)) == 50


@pytest.mark.launches
def test_import_d2l_ext_does_not_import_d2l():
    # d2l takes seconds to import: only the d2l-style classes import it, on first use
    code = "import sys, d2l_ext; print('d2l' in sys.modules, 'torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert done.stdout.split() == ["False", "True"]


def test_d2l_style_classes_train_with_d2l_trainer():
    from d2l import torch as d2l

    from d2l_ext.training import MLPClassifier, SyntheticClassificationData

    features, labels = synthetic_classification(1024)
    data = SyntheticClassificationData(features, labels, num_train=768, batch_size=128)
    assert len(data.train_dataloader()) == 6 and len(data.val_dataloader()) == 2
    torch.manual_seed(0)
    model = MLPClassifier(lr=0.1)
    assert isinstance(model, d2l.Classifier) and MLPClassifier.__qualname__ == "MLPClassifier"
    model.board.display = False
    before = model.net[0].weight.detach().clone()
    d2l.Trainer(max_epochs=1).fit(model, data)
    assert not torch.equal(model.net[0].weight, before)


def test_unknown_attribute_raises_attribute_error():
    with pytest.raises(AttributeError):
        training.NoSuchThing  # noqa: B018
