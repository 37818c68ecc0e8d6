"""Tensor-parallel decode on 2 processes over gloo, checked against one process (chapter 13.7): run it with
torchrun.

    torchrun --nproc-per-node=2 scripts/tp_decode.py MODEL.pt PROMPT NEW_TOKENS

MODEL.pt holds a d2l_ext.serving.GPT's ``config`` and ``state`` (chapter 13 saves its trained model so). Each rank
keeps half of every layer, as Megatron-LM splits a block (Shoeybi et al., 2019): whole query heads and their KV
heads, and half the MLP's hidden features. The attention's output projection and the MLP's down projection then
give partial sums, which one all-reduce each adds up: two all-reduces per layer per token. Every rank also runs
the whole model, and rank 0 prints whether the tokens are equal, the largest logit difference, and the
all-reduces counted per generated token.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

from d2l_ext import serving
from d2l_ext.ranks import join, leave, say

REDUCES: list[int] = []  # one entry per all-reduce this rank ran


def shard_state(state: dict, rank: int, world: int) -> dict:
    """This rank's part of a GPT's weights: q, k, v and up split by output rows, out and down by input
    columns; embeddings, norms and the head whole. ValueError if ``world`` does not divide a split."""
    part = {}
    for name, tensor in state.items():
        dim = 0 if name.endswith((".q.weight", ".k.weight", ".v.weight", ".up.weight")) else (
            1 if name.endswith((".out.weight", ".down.weight")) else None)
        if dim is not None and tensor.shape[dim] % world:
            raise ValueError(f"{world} processes do not divide {name}'s {tensor.shape[dim]} rows or columns")
        part[name] = tensor if dim is None else tensor.chunk(world, dim)[rank].clone()
    return part


def sharded_model(config: dict, state: dict, rank: int, world: int) -> serving.GPT:
    """The GPT one rank runs: its heads, KV heads and MLP features divided by ``world``."""
    if config["kv_heads"] % world:
        raise ValueError(f"{world} processes do not divide the {config['kv_heads']} KV heads")
    part = dict(config, heads=config["heads"] // world, kv_heads=config["kv_heads"] // world,
                ffn=config["ffn"] // world)
    model = serving.GPT(**part)
    model.load_state_dict(shard_state(state, rank, world))

    def all_reduce(x: torch.Tensor) -> torch.Tensor:
        REDUCES.append(x.numel())
        dist.all_reduce(x)
        return x

    model.reduce = all_reduce
    return model.eval()


def main(path: str, prompt: str, new_tokens: int) -> None:
    join(cpu=True)
    rank, world = dist.get_rank(), dist.get_world_size()
    saved = torch.load(path, weights_only=True)
    vocabulary = serving.Vocabulary(saved["text"])  # the characters the model was trained on
    whole = serving.GPT(**saved["config"])
    whole.load_state_dict(saved["state"])
    tokens = vocabulary.encode(prompt)
    alone = serving.generate(whole.eval(), tokens, new_tokens)
    with torch.no_grad():
        logits_alone = whole(alone[None])
    model = sharded_model(saved["config"], saved["state"], rank, world)
    split = serving.generate(model, tokens, new_tokens)
    reduces = len(REDUCES)
    with torch.no_grad():
        difference = (model(alone[None]) - logits_alone).abs().max().item()
    layers = saved["config"]["layers"]
    say(f"{world} processes, {layers} layers: tokens equal to one process's: {torch.equal(split, alone)}",
        f"logits within 1e-4 of one process's: {difference < 1e-4}",
        f"all-reduces: {reduces} for {new_tokens} tokens (prefill, then {new_tokens - 1} decode steps): "
        f"{reduces // new_tokens} per token, {reduces // new_tokens // layers} per layer")
    leave()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
