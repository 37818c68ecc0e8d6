"""Chapter 13: serving many requests. Static and continuous batching on a simulated clock (one tick per decode
iteration), and greedy speculative decoding with its expected speed-up."""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

import torch

from .serving import GPT, BlockAllocator, PagedCache, check_prompt


@dataclass(eq=False)
class Request:
    """A prompt and how many tokens to generate; what serving it gave (tokens, first and last tick)."""

    prompt: torch.Tensor
    new_tokens: int
    tokens: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.long))  # prompt, then more
    first_tick: int | None = None  # the tick its first token came out (the clock starts at 0)
    last_tick: int | None = None
    cache: PagedCache | None = field(default=None, repr=False)

    @property
    def ttft(self) -> int | None:
        """Time to first token, in ticks, for a request that arrived at tick 0."""
        return self.first_tick

    @property
    def tpot(self) -> Fraction | None:
        """Time per output token after the first, in ticks."""
        if self.new_tokens < 2 or self.first_tick is None or self.last_tick is None:
            return None
        return Fraction(self.last_tick - self.first_tick, self.new_tokens - 1)


def static_iterations(requests: list[Request], slots: int) -> int:
    """Decode iterations of static batching: batches of ``slots`` requests in arrival order, each running until
    its longest request is done (the sum, over batches, of the most new tokens in it)."""
    return sum(max([r.new_tokens for r in requests[i:i + slots]] + [0]) for i in range(0, len(requests), slots))


@torch.no_grad()
def serve_continuously(model: GPT, requests: list[Request], slots: int, allocator: BlockAllocator) -> int:
    """Serve ``requests`` with at most ``slots`` in the batch at once; return the decode iterations (ticks).

    At each tick, free slots take the next waiting requests (their prefill gives their first token), then one
    batched decode step gives every other running request its next token, and finished requests leave at once,
    their blocks back on the allocator's free list. A request with zero new tokens returns its prompt."""
    waiting, running, tick = list(requests), [], 0
    for r in requests:
        check_prompt(model, r.prompt, r.new_tokens)
    while waiting or running:
        if not running and all(r.new_tokens == 0 for r in waiting):  # nothing to decode
            for r in waiting:
                r.tokens = r.prompt.clone()
            break
        tick += 1
        stepping = list(running)  # running before this tick: one decode step each
        while waiting and len(running) < slots:
            r = waiting.pop(0)
            if r.new_tokens == 0:
                r.tokens = r.prompt.clone()
                continue
            r.cache = PagedCache(allocator)
            logits = model(r.prompt[None], [r.cache], [0])  # prefill
            r.tokens, r.first_tick = torch.cat([r.prompt, logits[0, -1].argmax()[None]]), tick
            running.append(r)
        if stepping:
            last = torch.stack([r.tokens[-1:] for r in stepping])
            logits = model(last, [r.cache for r in stepping], [len(r.tokens) - 1 for r in stepping])
            for r, row in zip(stepping, logits, strict=True):
                r.tokens = torch.cat([r.tokens, row[-1].argmax()[None]])
        for r in list(running):
            if len(r.tokens) - len(r.prompt) == r.new_tokens:
                r.last_tick = tick
                r.cache.release()
                running.remove(r)
    return tick


# ------------------------------------------------------------------------------------ speculative decoding
@dataclass
class Speculation:
    tokens: torch.Tensor
    rounds: int  # target forwards after the prefill: one per round
    accepted: int  # draft tokens kept
    proposed: int  # draft tokens proposed

    @property
    def acceptance(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0


@torch.no_grad()
def speculate(target: GPT, draft: GPT, prompt: torch.Tensor, new_tokens: int, k: int = 4) -> Speculation:
    """Greedy speculative decoding: each round the draft proposes up to ``k`` tokens one by one; the target
    checks them all in one forward and keeps the longest prefix that equals its own greedy choices, then adds
    its own next token. The output equals the target's greedy output, whatever the draft."""
    if draft.config["vocab"] != target.config["vocab"]:
        raise ValueError(f"the draft's vocabulary ({draft.config['vocab']} tokens) differs from the "
                         f"target's ({target.config['vocab']}): its proposals would mean other tokens")
    check_prompt(target, prompt, new_tokens)
    check_prompt(draft, prompt, new_tokens)
    if new_tokens == 0:
        return Speculation(prompt.clone(), 0, 0, 0)
    t_cache, d_cache = target.new_cache(), draft.new_cache()
    logits = target(prompt[None], [t_cache], [0])
    draft(prompt[None], [d_cache], [0])  # the draft's cache holds every token but the last
    tokens = torch.cat([prompt, logits[0, -1].argmax()[None]])
    rounds = accepted = proposed = 0
    while len(tokens) - len(prompt) < new_tokens:
        n = len(tokens)
        ahead = min(k, new_tokens - (n - len(prompt)) - 1)  # never past the tokens asked for
        guesses = tokens.clone()
        for i in range(ahead):  # the draft catches up from its cache, then proposes
            start = n - 1 + i
            d_logits = draft(guesses[None, start:start + 1], [d_cache], [start])
            guesses = torch.cat([guesses, d_logits[0, -1].argmax()[None]])
        proposal = guesses[n:]
        check = target(guesses[None, n - 1:], [t_cache], [n - 1])[0].argmax(-1)  # ahead + 1 choices
        kept = 0
        while kept < ahead and proposal[kept] == check[kept]:
            kept += 1
        tokens = torch.cat([tokens, proposal[:kept], check[kept:kept + 1]])
        if kept == ahead and ahead > 0:  # the draft never saw its own last token: feed it next round
            draft(tokens[None, n - 1 + ahead:n + ahead], [d_cache], [n - 1 + ahead])
        rounds, accepted, proposed = rounds + 1, accepted + kept, proposed + ahead
    # the prefill's token counts as a round: accepted + rounds = new tokens
    return Speculation(tokens, rounds + 1, accepted, proposed)


def expected_tokens_per_round(alpha: Fraction, k: int) -> Fraction:
    """Leviathan et al. (2023), eq. 1: a target forward yields (1 - α^(k+1)) / (1 - α) tokens on average when
    each of ``k`` drafts is accepted with probability α, independently."""
    return Fraction(k + 1) if alpha == 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


def simulated_tokens_per_round(alpha: Fraction, k: int) -> Fraction:
    """The same expectation by enumeration: n drafts accepted (probability α^n (1 - α), or α^k for all k), each
    round giving n + 1 tokens."""
    return sum((alpha ** n * (1 - alpha) * (n + 1) for n in range(k)), Fraction(0)) + alpha ** k * (k + 1)


def expected_speedup(alpha: Fraction, k: int, cost: Fraction) -> Fraction:
    """Leviathan et al. (2023), theorem 3.8: the expected speed-up over plain decoding when a draft forward costs
    ``cost`` target forwards: (1 - α^(k+1)) / ((1 - α)(k·cost + 1))."""
    return expected_tokens_per_round(alpha, k) / (k * cost + 1)
