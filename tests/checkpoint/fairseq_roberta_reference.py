"""fairseq's RoBERTa masked LM forward in float64 numpy, independent of normformer's code.

Written from fairseq's models/roberta/model.py (RobertaModel.build_model from the checkpoint's
args after base_architecture's defaults; RobertaEncoder: `sentence_encoder`, a
TransformerEncoder, and `lm_head`, a RobertaLMHead whose weight is the token embedding unless
untie_weights_roberta), models/transformer/transformer_encoder.py (forward_embedding: embed_scale
x tokens + positions, then layernorm_embedding when set; the final LayerNorm with
encoder_normalize_before; upgrade_state_dict_named: the final LayerNorm is dropped unless
encoder.sentence_encoder.version >= 2; then a strict load_state_dict),
modules/transformer_layer.py (TransformerEncoderLayerBase.forward, Pre-LN: x + attn(LN(x)), then
x + fc2(act(fc1(LN(x))))), modules/multihead_attention.py (q scaled by head_dim^-0.5 after its
bias, no mask between unpadded tokens, softmax, out_proj) and RobertaLMHead.forward (dense,
activation, LayerNorm, the projection plus bias). Positions, LayerNorm and activations are
fairseq_reference.py's (the decoder's modules are the same ones).

The architecture comes from the `fairseq.roberta_args` the export records (Python assignments,
the args a fairseq checkpoint carries), completed with roberta base_architecture's defaults for
what they leave out. Evaluation mode: dropout is off.
"""
import ast
import math

import numpy as np

from fairseq_reference import (PADDING_IDX, activation, layer_norm, make_positions,
                               sinusoidal_table, strict_load)

# roberta/model.py base_architecture: what a checkpoint's args leave out takes these.
BASE_ARCHITECTURE = {
    "encoder_layers": 12, "encoder_embed_dim": 768, "encoder_ffn_embed_dim": 3072,
    "encoder_attention_heads": 12, "activation_fn": "gelu", "max_positions": 512,
    "encoder_normalize_before": False, "layernorm_embedding": True, "no_scale_embedding": True,
    "encoder_learned_pos": True, "untie_weights_roberta": False,
}
SENTENCE = "encoder.sentence_encoder"


def parse_args(text):
    """'arch=\'roberta\' encoder_layers=2 ...' -> dict over base_architecture's defaults."""
    args = dict(BASE_ARCHITECTURE)
    for assignment in text.split():
        key, value = assignment.split("=", 1)
        args[key] = ast.literal_eval(value)
    assert args.get("arch") == "roberta", text
    return args


class Roberta:
    def __init__(self, args, state_dict):
        self.a = args
        self.p = {name: np.asarray(value, dtype=np.float64) for name, value in state_dict.items()}
        # TransformerEncoder.upgrade_state_dict_named: a version below 2 drops the final LayerNorm
        # (and records version 1); the strict load then finds its tensors unexpected.
        version = self.p.get(f"{SENTENCE}.version", np.array([1.0]))
        self.final_norm = self.a["encoder_normalize_before"] and bool(version[0] >= 2)
        if not bool(version[0] >= 2):
            self.p[f"{SENTENCE}.version"] = np.array([1.0])
        self.strict_load()
        if not self.a["untie_weights_roberta"]:
            # One Parameter under both names: the file's two copies must be one tensor.
            assert np.array_equal(self.p["encoder.lm_head.weight"],
                                  self.p[f"{SENTENCE}.embed_tokens.weight"])

    def expected_names(self):
        """The state dict keys of the model fairseq builds from the args (a sinusoidal table's
        _float_tensor buffer left out: upgrade_state_dict_named adds it)."""
        a = self.a
        names = {f"{SENTENCE}.version", f"{SENTENCE}.embed_tokens.weight",
                 "encoder.lm_head.weight", "encoder.lm_head.bias"}
        names |= {f"encoder.lm_head.{m}.{s}" for m in ("dense", "layer_norm")
                  for s in ("weight", "bias")}
        if a["encoder_learned_pos"]:
            names.add(f"{SENTENCE}.embed_positions.weight")
        if a["layernorm_embedding"]:
            names |= {f"{SENTENCE}.layernorm_embedding.weight",
                      f"{SENTENCE}.layernorm_embedding.bias"}
        if self.final_norm:
            names |= {f"{SENTENCE}.layer_norm.weight", f"{SENTENCE}.layer_norm.bias"}
        modules = ["self_attn.k_proj", "self_attn.v_proj", "self_attn.q_proj", "self_attn.out_proj",
                   "self_attn_layer_norm", "final_layer_norm", "fc1", "fc2"]
        for layer in range(a["encoder_layers"]):
            names |= {f"{SENTENCE}.layers.{layer}.{m}.{s}" for m in modules
                      for s in ("weight", "bias")}
        return names

    def strict_load(self):
        strict_load(self.expected_names(), self.p.keys(), "args")
        if not self.a["encoder_normalize_before"]:
            raise ValueError("the args build a post-LN encoder (encoder_normalize_before False); "
                             "this reference computes Pre-LN layers only")

    def logits(self, tokens):
        """tokens: int [batch, time], without PADDING_IDX. Returns [batch, time, vocab]."""
        a = self.a
        tokens = np.asarray(tokens)
        assert not (tokens == PADDING_IDX).any(), "the reference runs unpadded sequences only"
        dim = a["encoder_embed_dim"]
        positions = make_positions(tokens)
        if a["encoder_learned_pos"]:
            table = self.p[f"{SENTENCE}.embed_positions.weight"]
            assert table.shape[0] == a["max_positions"] + PADDING_IDX + 1, table.shape
        else:
            table = sinusoidal_table(PADDING_IDX + 1 + tokens.shape[1], dim)
        scale = 1.0 if a["no_scale_embedding"] else math.sqrt(dim)
        x = scale * self.p[f"{SENTENCE}.embed_tokens.weight"][tokens] + table[positions]
        if a["layernorm_embedding"]:
            x = self.norm(f"{SENTENCE}.layernorm_embedding", x)
        for layer in range(a["encoder_layers"]):
            x = self.layer(f"{SENTENCE}.layers.{layer}", x)
        if self.final_norm:
            x = self.norm(f"{SENTENCE}.layer_norm", x)
        x = activation(a["activation_fn"], self.linear("encoder.lm_head.dense", x))
        x = self.norm("encoder.lm_head.layer_norm", x)
        return x @ self.p["encoder.lm_head.weight"].T + self.p["encoder.lm_head.bias"]

    def linear(self, name, x):
        return x @ self.p[name + ".weight"].T + self.p[name + ".bias"]

    def norm(self, name, x):
        return layer_norm(x, self.p[name + ".weight"], self.p[name + ".bias"])

    def attention(self, name, x):
        heads = self.a["encoder_attention_heads"]
        batch, time, dim = x.shape
        head_dim = dim // heads
        split = lambda y: y.reshape(batch, time, heads, head_dim).transpose(0, 2, 1, 3)
        q = split(self.linear(name + ".q_proj", x) * head_dim ** -0.5)
        k = split(self.linear(name + ".k_proj", x))
        v = split(self.linear(name + ".v_proj", x))
        scores = q @ k.transpose(0, 1, 3, 2)  # [batch, heads, time, time]: every key
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        probs = scores / scores.sum(axis=-1, keepdims=True)
        merged = (probs @ v).transpose(0, 2, 1, 3).reshape(batch, time, dim)
        return self.linear(name + ".out_proj", merged)

    def layer(self, name, x):
        x = x + self.attention(name + ".self_attn", self.norm(name + ".self_attn_layer_norm", x))
        h = activation(self.a["activation_fn"],
                       self.linear(name + ".fc1", self.norm(name + ".final_layer_norm", x)))
        return x + self.linear(name + ".fc2", h)


def masked_lm_loss(logits, targets):
    """fairseq's masked_lm criterion: the summed cross-entropy at the positions whose target is
    not -1 (its padding id there), divided by their number. logits [..., vocab]."""
    logits = np.asarray(logits, dtype=np.float64)
    chosen = targets >= 0
    rows = logits[chosen]
    shifted = rows - rows.max(axis=-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    return -log_probs[np.arange(len(rows)), targets[chosen]].sum() / chosen.sum()
