"""fairseq's transformer_lm forward in float64 numpy, independent of normformer's code.

Written from fairseq's models/transformer_lm.py (TransformerLanguageModelConfig: what
fairseq-train builds from its flags; a field a flag leaves out takes the dataclass default, so
decoder_normalize_before is off and decoder_input_dim / decoder_output_dim are 512 unless the flags
say otherwise), models/transformer/transformer_decoder.py (the parameters it builds:
project_in_dim / project_out_dim when those dims differ from decoder_embed_dim, the final
LayerNorm only with decoder_normalize_before and without no_decoder_final_norm;
extract_features; upgrade_state_dict_named: the final LayerNorm is dropped unless
decoder.version > 2, a shared head is the embedding; then a strict load_state_dict), modules/transformer_layer.py (TransformerDecoderLayerBase.forward with
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
        self.input_dim = int(valued.get("--decoder-input-dim", 512))
        self.output_dim = int(valued.get("--decoder-output-dim", 512))
        self.normalize_before = "--decoder-normalize-before" in switches
        self.final_norm = self.normalize_before and "--no-decoder-final-norm" not in switches
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


def strict_load(expected, names, built_from):
    """torch's load_state_dict(strict=True): the file's names are exactly the model's."""
    missing = sorted(expected - names)
    unexpected = sorted(names - expected)
    if missing or unexpected:
        raise ValueError(f"the {built_from} build another model: missing {missing[:4]}, "
                         f"unexpected {unexpected[:4]}")


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
        self.final_norm = self.arch.final_norm and bool(version[0] > 2)
        if self.arch.final_norm and not self.final_norm:  # the upgrade drops the module
            self.p = {k: v for k, v in self.p.items() if not k.startswith("decoder.layer_norm.")}
        self.p["decoder.version"] = np.array([3.0] if self.final_norm else [1.0])
        if "decoder.output_projection.weight" not in self.p and self.arch.share_embed:
            self.p["decoder.output_projection.weight"] = self.p["decoder.embed_tokens.weight"]
        self.strict_load()

    def expected_names(self):
        """The state dict keys of the model fairseq builds from the flags (sinusoidal positions'
        _float_tensor buffer left out: upgrade_state_dict_named adds it)."""
        a = self.arch
        names = {"decoder.version", "decoder.embed_tokens.weight",
                 "decoder.output_projection.weight"}
        if a.learned_pos:
            names.add("decoder.embed_positions.weight")
        if a.input_dim != a.embed_dim:
            names.add("decoder.project_in_dim.weight")
        if a.output_dim != a.embed_dim:
            names.add("decoder.project_out_dim.weight")
        if self.final_norm:
            names |= {"decoder.layer_norm.weight", "decoder.layer_norm.bias"}
        modules = ["self_attn.k_proj", "self_attn.v_proj", "self_attn.q_proj", "self_attn.out_proj",
                   "self_attn_layer_norm", "final_layer_norm", "fc1", "fc2"]
        modules += ["attn_ln"] if a.scale_attn else []
        modules += ["ffn_layernorm"] if a.scale_fc else []
        for layer in range(a.layers):
            prefix = f"decoder.layers.{layer}."
            names |= {prefix + m + suffix for m in modules for suffix in (".weight", ".bias")}
            names |= {prefix + "c_attn"} if a.scale_heads else set()
            names |= {prefix + "w_resid"} if a.scale_resids else set()
        return names

    def strict_load(self):
        strict_load(self.expected_names(), self.p.keys(), "flags")
        if not self.arch.normalize_before:
            raise ValueError("the flags build a post-LN model (no --decoder-normalize-before); "
                             "this reference computes pre-LN layers only")

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
