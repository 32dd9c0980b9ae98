"""The engine at world size 1 against an independent, plain nanoGPT.

The matrix compares every plan with the engine's own serial run; a bug shared by both paths (a
wrong mask, a missing bias, a mis-scaled loss) would hide there. This model shares nothing with the
engine but the initial values (`gpt.init_tensor`) and the synthetic data: torch's LayerNorm, Linear,
scaled_dot_product_attention, GELU, cross_entropy and AdamW, the whole global batch in one forward.
"""

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from parallel.core.specs import MODELS
from parallel.engine import data
from parallel.engine.gpt import full_shapes, init_tensor
from parallel.engine.metrics import full_state_dict
from runfiles.metrics import load_metrics
from tests.integration.test_engine_matrix import GLOBAL_BATCH, LR, STEPS, train_cli


class Block(nn.Module):
    def __init__(self, h, heads):
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(h), nn.LayerNorm(h)
        self.c_attn, self.attn_proj = nn.Linear(h, 3 * h), nn.Linear(h, h)
        self.c_fc, self.mlp_proj = nn.Linear(h, 4 * h), nn.Linear(4 * h, h)

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class NanoGPT(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(m.vocab, m.hidden), nn.Embedding(m.seq_len, m.hidden)
        self.h = nn.ModuleList(Block(m.hidden, m.heads) for _ in range(m.layers))
        self.ln_f = nn.LayerNorm(m.hidden)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.size(1)))
        for block in self.h:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # tied output layer
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))

    def engine_name(self, name: str) -> str:
        return (
            name.replace("attn_proj", "attn.c_proj")
            .replace("c_attn", "attn.c_attn")
            .replace("c_fc", "mlp.c_fc")
            .replace("mlp_proj", "mlp.c_proj")
        )


@pytest.mark.slow
def test_engine_at_world_one_is_plain_nanogpt(tmp_path):
    model = MODELS["tiny"]
    r = train_cli(tmp_path, "--save-params")
    assert r.returncode == 0, r.stderr[-3000:]
    torch.set_num_threads(1)
    ref = NanoGPT(model)
    shapes = full_shapes(model)
    with torch.no_grad():
        for name, p in ref.named_parameters():
            p.copy_(init_tensor(ref.engine_name(name), shapes[ref.engine_name(name)], seed=0, layers=model.layers))
    opt = torch.optim.AdamW(ref.parameters(), lr=LR, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    losses, first_grads = [], None
    for step in range(STEPS):
        batch = data.global_batch(
            step=step, seed=0, global_batch=GLOBAL_BATCH, seq_len=model.seq_len, vocab=model.vocab
        )
        opt.zero_grad()
        loss = ref(batch[:, :-1], batch[:, 1:])
        loss.backward()
        if step == 0:
            first_grads = {ref.engine_name(n): p.grad.clone() for n, p in ref.named_parameters()}
        opt.step()
        losses.append(loss.item())

    engine = load_metrics(tmp_path)["loss"]
    assert losses[0] == pytest.approx(math.log(model.vocab), rel=0.01)  # untrained: uniform guess
    for ours, theirs in zip(engine, losses):
        assert abs(ours - theirs) <= 1e-5 * abs(theirs), (engine, losses)
    grads = full_state_dict(tmp_path, key="grads")
    params = full_state_dict(tmp_path)
    assert set(grads) == set(first_grads) == set(shapes)
    for name, p in ref.named_parameters():
        name = ref.engine_name(name)
        g = first_grads[name]
        torch.testing.assert_close(grads[name], g, rtol=1e-4, atol=1e-6 * g.abs().max().item(), msg=name)
        torch.testing.assert_close(params[name], p.detach(), rtol=0, atol=LR / 10, msg=name)
