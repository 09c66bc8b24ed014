"""fairseq's transformer_lm forward in float64 numpy, independent of normformer's code.

Written from fairseq's models/transformer_lm.py (base_lm_architecture: decoder_normalize_before
is always on), models/transformer/transformer_decoder.py (extract_features, and
upgrade_state_dict_named: the final LayerNorm is dropped unless decoder.version > 2; a shared
head is the embedding), modules/transformer_layer.py (TransformerDecoderLayerBase.forward with
attn_ln, c_attn, ffn_layernorm and w_resid), modules/multihead_attention.py (q scaled by
head_dim^-0.5 after its bias, causal mask, softmax, out_proj), modules/positional_embedding.py,
sinusoidal_positional_embedding.py, learned_positional_embedding.py and utils.make_positions
(positions numbered from padding_idx + 1 = 2), modules/gelu.py and utils.get_activation_fn.

The architecture comes from fairseq-train flags, as a fairseq user builds it; the parameters
from a state dict by fairseq's names (numpy arrays). Evaluation mode: dropout is off.
"""
import math
import shlex

import numpy as np

PADDING_IDX = 1  # fairseq Dictionary: <s> 0, <pad> 1, </s> 2, <unk> 3
LAYER_NORM_EPS = 1e-5  # torch.nn.LayerNorm's default, which fairseq's LayerNorm keeps


class Architecture:
    """The transformer_lm options the flags set, with base_lm_architecture's defaults."""

    def __init__(self, flags):
        words = shlex.split(flags)
        valued = {}
        switches = set()
        i = 0
        while i < len(words):
            word = words[i]
            if i + 1 < len(words) and not words[i + 1].startswith("--"):
                valued[word] = words[i + 1]
                i += 2
            else:
                switches.add(word)
                i += 1
        assert valued.get("--arch") == "transformer_lm", flags
        self.layers = int(valued.get("--decoder-layers", 6))
        self.embed_dim = int(valued.get("--decoder-embed-dim", 512))
        self.ffn_dim = int(valued.get("--decoder-ffn-embed-dim", 2048))
        self.heads = int(valued.get("--decoder-attention-heads", 8))
        self.activation = valued.get("--activation-fn", "relu")
        self.max_target_positions = int(valued.get("--max-target-positions",
                                                   valued.get("--tokens-per-sample", 1024)))
        self.learned_pos = "--decoder-learned-pos" in switches
        self.share_embed = "--share-decoder-input-output-embed" in switches
        self.no_scale_embedding = "--no-scale-embedding" in switches
        self.scale_attn = "--scale-attn" in switches
        self.scale_fc = "--scale-fc" in switches
        self.scale_heads = "--scale-heads" in switches
        self.scale_resids = "--scale-resids" in switches


def make_positions(tokens):
    """utils.make_positions: non-padding tokens numbered from PADDING_IDX + 1 along each row."""
    mask = (tokens != PADDING_IDX).astype(np.int64)
    return np.cumsum(mask, axis=1) * mask + PADDING_IDX


def sinusoidal_table(rows, dim):
    """SinusoidalPositionalEmbedding.get_embedding: [sin | cos] halves, the padding row zero."""
    half = dim // 2
    rate = math.log(10000) / (half - 1)
    freqs = np.exp(np.arange(half, dtype=np.float64) * -rate)
    angles = np.arange(rows, dtype=np.float64)[:, None] * freqs[None, :]
    table = np.concatenate([np.sin(angles), np.cos(angles)], axis=1)
    if dim % 2 == 1:
        table = np.concatenate([table, np.zeros((rows, 1))], axis=1)
    table[PADDING_IDX, :] = 0
    return table


def layer_norm(x, weight, bias):
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + LAYER_NORM_EPS) * weight + bias


_erf = np.frompyfunc(math.erf, 1, 1)


def activation(name, x):
    if name == "gelu":  # torch's exact gelu
        return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)).astype(np.float64))
    if name == "gelu_accurate":
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    if name == "relu":
        return np.maximum(x, 0.0)
    raise ValueError(f"activation {name} is not in this reference")


class TransformerLM:
    def __init__(self, flags, state_dict):
        self.arch = Architecture(flags)
        self.p = {name: np.asarray(value, dtype=np.float64) for name, value in state_dict.items()}
        # upgrade_state_dict_named: without decoder.version > 2 the final LayerNorm is dropped.
        version = self.p.get("decoder.version", np.array([1.0]))
        self.final_norm = bool(version[0] > 2)
        if "decoder.output_projection.weight" not in self.p and self.arch.share_embed:
            self.p["decoder.output_projection.weight"] = self.p["decoder.embed_tokens.weight"]

    def logits(self, tokens):
        """tokens: int [batch, time], without PADDING_IDX. Returns [batch, time, vocab]."""
        a = self.arch
        tokens = np.asarray(tokens)
        assert not (tokens == PADDING_IDX).any(), "the reference runs unpadded sequences only"
        batch, time = tokens.shape
        positions = make_positions(tokens)
        if a.learned_pos:
            table = self.p["decoder.embed_positions.weight"]
            assert table.shape[0] == a.max_target_positions + PADDING_IDX + 1, table.shape
        else:
            table = sinusoidal_table(PADDING_IDX + 1 + time, a.embed_dim)
        scale = 1.0 if a.no_scale_embedding else math.sqrt(a.embed_dim)
        x = scale * self.p["decoder.embed_tokens.weight"][tokens] + table[positions]
        for layer in range(a.layers):
            x = self.layer(f"decoder.layers.{layer}", x)
        if self.final_norm:
            x = self.norm("decoder.layer_norm", x)
        return x @ self.p["decoder.output_projection.weight"].T

    def linear(self, name, x):
        return x @ self.p[name + ".weight"].T + self.p[name + ".bias"]

    def norm(self, name, x):
        return layer_norm(x, self.p[name + ".weight"], self.p[name + ".bias"])

    def attention(self, name, x):
        a = self.arch
        batch, time, dim = x.shape
        head_dim = dim // a.heads
        split = lambda y: y.reshape(batch, time, a.heads, head_dim).transpose(0, 2, 1, 3)
        q = split(self.linear(name + ".q_proj", x) * head_dim ** -0.5)
        k = split(self.linear(name + ".k_proj", x))
        v = split(self.linear(name + ".v_proj", x))
        scores = q @ k.transpose(0, 1, 3, 2)  # [batch, heads, time, time]
        future = np.triu(np.ones((time, time), dtype=bool), 1)
        scores = np.where(future, -np.inf, scores)
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        probs = scores / scores.sum(axis=-1, keepdims=True)
        heads = (probs @ v).transpose(0, 2, 1, 3).reshape(batch, time, dim)
        return self.linear(name + ".out_proj", heads)

    def layer(self, name, x):
        a = self.arch
        residual = x
        x = self.norm(name + ".self_attn_layer_norm", x)
        x = self.attention(name + ".self_attn", x)
        if a.scale_heads:  # c_attn on out_proj's output viewed as heads
            batch, time, dim = x.shape
            x = (x.reshape(batch, time, a.heads, dim // a.heads)
                 * self.p[name + ".c_attn"][None, None, :, None]).reshape(batch, time, dim)
        if a.scale_attn:
            x = self.norm(name + ".attn_ln", x)
        x = residual + x
        residual = x
        x = self.norm(name + ".final_layer_norm", x)
        x = activation(a.activation, self.linear(name + ".fc1", x))
        if a.scale_fc:
            x = self.norm(name + ".ffn_layernorm", x)
        x = self.linear(name + ".fc2", x)
        if a.scale_resids:
            residual = self.p[name + ".w_resid"] * residual
        return residual + x
