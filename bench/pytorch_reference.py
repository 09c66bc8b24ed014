"""The project's NormFormer / Pre-LN language model in PyTorch, for bench/pytorch_compare.py.

The same function as model/normformer_model.cc and model/decoder_layer.cc (docs/design.md
section 4), fp32, under the project's parameter names so that nf-bench-step-peer --dump's file
loads as it is:
  x = E[ids] * sqrt(d) + sinusoidal(first_position + t); dropout
  per layer (Pre-LN; NormFormer adds the parts in brackets):
    h = LN_attn_in(x); q, k, v = h Wq + bq, ...; a = causal softmax(q k^T / sqrt(dh)) v
    (attention dropout on the probabilities); [a *= c_attn per head, before out_proj];
    o = a Wo + bo; [o = LN_post_attn(o)]; x = x + dropout(o)
    f = gelu_exact(LN_ffn_in(x) W1 + b1); [f = LN_ffn_mid(f)]; x = x + dropout(f W2 + b2)
  logits = LN_final(x) E^T (tied, padded rows included), loss = mean cross-entropy over the
  vocabulary's real rows.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def padded_vocab(vocab):
    """model/vocab.h: rows rounded up to a multiple of 128 (one tensor-parallel rank)."""
    return (vocab + 127) // 128 * 128


def sinusoidal_table(rows, first, d):
    """fairseq's table for positions first .. first + rows - 1 (normformer_model.cc)."""
    half = d // 2
    step = math.log(10000.0) / (half - 1) if half > 1 else 0.0
    freqs = torch.exp(-step * torch.arange(half, dtype=torch.float64))
    angles = torch.arange(first, first + rows, dtype=torch.float64)[:, None] * freqs[None, :]
    table = torch.zeros(rows, d, dtype=torch.float64)
    table[:, :half] = torch.sin(angles)
    table[:, half : 2 * half] = torch.cos(angles)
    return table.float()


class Layer(nn.Module):
    def __init__(self, d, heads, ffn, normformer, dropout, attention_dropout):
        super().__init__()
        self.heads, self.normformer = heads, normformer
        self.dropout, self.attention_dropout = dropout, attention_dropout
        self.self_attn_layer_norm = nn.LayerNorm(d)
        self.self_attn = nn.Module()
        for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
            setattr(self.self_attn, name, nn.Linear(d, d))
        self.final_layer_norm = nn.LayerNorm(d)
        self.fc1, self.fc2 = nn.Linear(d, ffn), nn.Linear(ffn, d)
        if normformer:
            self.c_attn = nn.Parameter(torch.ones(heads))
            self.attn_ln = nn.LayerNorm(d)
            self.ffn_layernorm = nn.LayerNorm(ffn)

    def forward(self, x):
        b, s, d = x.shape
        h = self.self_attn_layer_norm(x)
        attn = self.self_attn

        def split(t):
            return t.view(b, s, self.heads, d // self.heads).transpose(1, 2)

        q, k, v = split(attn.q_proj(h)), split(attn.k_proj(h)), split(attn.v_proj(h))
        a = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.attention_dropout if self.training else 0.0
        )
        if self.normformer:
            a = a * self.c_attn.view(1, -1, 1, 1)
        o = attn.out_proj(a.transpose(1, 2).reshape(b, s, d))
        if self.normformer:
            o = self.attn_ln(o)
        x = x + F.dropout(o, self.dropout, self.training)
        f = F.gelu(self.fc1(self.final_layer_norm(x)))
        if self.normformer:
            f = self.ffn_layernorm(f)
        return x + F.dropout(self.fc2(f), self.dropout, self.training)


class Decoder(nn.Module):
    def __init__(self, layers, d, heads, ffn, vocab, seq, normformer, dropout, attention_dropout,
                 first_position=2):
        super().__init__()
        self.vocab, self.d, self.dropout = vocab, d, dropout
        self.embed_tokens = nn.Embedding(padded_vocab(vocab), d)
        nn.init.normal_(self.embed_tokens.weight, std=d**-0.5)
        self.register_buffer("positions", sinusoidal_table(seq, first_position, d))
        self.layers = nn.ModuleList(
            Layer(d, heads, ffn, normformer, dropout, attention_dropout) for _ in range(layers)
        )
        self.layer_norm = nn.LayerNorm(d)

    def forward(self, ids, targets):
        """Sum of token losses (nats), as the project's Forward returns it."""
        x = self.embed_tokens(ids) * math.sqrt(self.d) + self.positions[: ids.shape[1]]
        x = F.dropout(x, self.dropout, self.training)
        for layer in self.layers:
            x = layer(x)
        logits = self.layer_norm(x) @ self.embed_tokens.weight.t()
        return F.cross_entropy(
            logits[..., : self.vocab].reshape(-1, self.vocab), targets.reshape(-1), reduction="sum"
        )


def param_groups(model, weight_decay):
    """AdamW's decay on matrices only (the project's DecayRanges: no decay on biases, LayerNorm
    and scales)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def load_named(model, tensors):
    """Copies the project's parameters (name -> tensor) into the model; every name must match."""
    own = dict(model.named_parameters())
    for name, value in tensors.items():
        key = name[len("decoder."):]
        if key not in own:
            raise KeyError(f"{name}: no such parameter in the PyTorch model")
        with torch.no_grad():
            own[key].copy_(value.view_as(own[key]))
    missing = set(own) - {n[len("decoder."):] for n in tensors}
    if missing:
        raise KeyError(f"not in the file: {sorted(missing)}")
