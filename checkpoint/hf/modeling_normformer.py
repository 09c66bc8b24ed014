"""PyTorch NormFormer (Shleifer et al. 2021, arXiv 2110.09456), as the normformer project trains it.

The math is docs/design.md section 4, and the parameter names are the project's fairseq names with
"decoder." replaced by "model.", so `nf-ckpt export --format hf` copies every tensor as trained:
the head scales `c_attn` in their placement (never folded into out_proj), `w_resid`, the
LayerNorms `attn_ln` and `ffn_layernorm`. A masked LM (config.objective "masked_lm", section 4.8)
is the same layers attending both ways under RoBERTa's head, whose decoder.lm_head.* are lm_head.*
here. Shapes below: B batch, S new tokens, K keys (past and new), d hidden_size, H heads,
Dh = d / H, F intermediate_size, V vocab_size.
"""
import math
from collections.abc import Callable
from functools import partial

import torch
from torch import nn

from transformers import initialization as init
from transformers.cache_utils import Cache, DynamicCache
from transformers.generation import GenerationMixin
from transformers.masking_utils import create_bidirectional_mask, create_causal_mask
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutputWithPast,
    CausalLMOutputWithPast,
    MaskedLMOutput,
)
from transformers.modeling_utils import (
    ALL_ATTENTION_FUNCTIONS,
    PreTrainedModel,
    slice_logits_to_keep,
)
from transformers.processing_utils import Unpack
from transformers.utils import TransformersKwargs, can_return_tuple
from transformers.utils.deprecation import deprecate_kwarg
from transformers.utils.generic import merge_with_config_defaults
from transformers.utils.output_capturing import capture_outputs

from .configuration_normformer import NormFormerConfig


def relu_squared(x: torch.Tensor) -> torch.Tensor:
    return torch.square(torch.relu(x))


ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": partial(nn.functional.gelu, approximate="none"),  # erf form
    "gelu_tanh": partial(nn.functional.gelu, approximate="tanh"),
    "relu_squared": relu_squared,
}


def sinusoidal_table(rows: int, dim: int) -> torch.Tensor:
    """fairseq's sinusoidal positions [rows, dim], row p for position p: sin(p w_i) in column i and
    cos(p w_i) in column dim/2 + i, w_i = 10000^(-i / (dim/2 - 1)); an odd dim leaves the last
    column zero. The angles are computed in float64 and rounded once, as the project's table is
    (fairseq's own float32 angles differ from these by up to ~1e-4 at positions in the
    thousands)."""
    half = dim // 2
    # A single frequency (dim < 4) is position itself, as the project computes it.
    step = math.log(10000.0) / (half - 1) if half > 1 else 0.0
    freqs = torch.exp(torch.arange(half, dtype=torch.float64) * -step)  # [half]
    angles = torch.arange(rows, dtype=torch.float64)[:, None] * freqs[None, :]  # [rows, half]
    table = torch.zeros(rows, dim, dtype=torch.float64)
    table[:, :half] = torch.sin(angles)
    table[:, half : 2 * half] = torch.cos(angles)
    return table.float()


class NormFormerSinusoidalPositions(nn.Module):
    """Computed positions: a table buffer that is not saved (the checkpoint holds no tensor)."""

    def __init__(self, config: NormFormerConfig):
        super().__init__()
        self.rows = config.max_position_embeddings + config.first_position
        self.dim = config.hidden_size
        self.table = nn.Buffer(sinusoidal_table(self.rows, self.dim), persistent=False)

    def forward(self, positions: torch.LongTensor) -> torch.Tensor:
        """positions [B, S] (first_position already added) -> [B, S, d]."""
        return self.table[positions]


class NormFormerLearnedPositions(nn.Embedding):
    """Learned positions, [max_position_embeddings + first_position, d]: row p is position p, so
    rows below first_position exist (fairseq's layout) but are never read."""

    def __init__(self, config: NormFormerConfig):
        super().__init__(config.max_position_embeddings + config.first_position, config.hidden_size)


class NormFormerLinear(nn.Linear):
    """nn.Linear that records how the project initialises it (docs/design.md section 4.5):
    xavier-uniform weights with `xavier_gain`, or U(+-in_features^-1/2) when it is None; biases
    U(+-in_features^-1/2), or zero."""

    def __init__(self, in_features: int, out_features: int, xavier_gain: float | None = None,
                 zero_bias: bool = False):
        super().__init__(in_features, out_features)
        self.xavier_gain = xavier_gain
        self.zero_bias = zero_bias


def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs: Unpack[TransformersKwargs],
) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q k^T * scaling + mask) v, the probabilities dropped out in training.

    query [B, H, S, Dh], key and value [B, H, K, Dh], attention_mask additive [B, 1, S, K].
    Returns the heads [B, S, H, Dh] (the layout every attention interface returns) and the
    probabilities [B, H, S, K]."""
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        scores = scores + attention_mask
    probs = nn.functional.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    probs = nn.functional.dropout(probs, p=dropout, training=module.training)
    heads = torch.matmul(probs, value).transpose(1, 2).contiguous()
    return heads, probs


class NormFormerAttention(nn.Module):
    """Multi-head self-attention with separate q, k, v projections (fairseq's names): causal, or
    bidirectional in a masked LM.

    The BEFORE_OUT_PROJ head scale multiplies each head's output here, between the attention and
    out_proj, so the layer passes it in; the AFTER_OUT_PROJ one acts on this module's output."""

    def __init__(self, config: NormFormerConfig, layer_idx: int):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_dropout
        self.is_causal = config.objective == "causal_lm"
        d = config.hidden_size
        self.q_proj = NormFormerLinear(d, d, xavier_gain=2**-0.5)
        self.k_proj = NormFormerLinear(d, d, xavier_gain=2**-0.5)
        self.v_proj = NormFormerLinear(d, d, xavier_gain=2**-0.5)
        self.out_proj = NormFormerLinear(d, d, xavier_gain=1.0, zero_bias=True)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None,
        head_scale: torch.Tensor | None = None,
        cache: Cache | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """hidden_states [B, S, d]; head_scale [H] or None. Returns [B, S, d] and the attention
        probabilities where the attention implementation gives them."""
        batch, length, _ = hidden_states.shape
        split = (batch, length, self.num_heads, self.head_dim)
        query = self.q_proj(hidden_states).view(split).transpose(1, 2)  # [B, H, S, Dh]
        key = self.k_proj(hidden_states).view(split).transpose(1, 2)
        value = self.v_proj(hidden_states).view(split).transpose(1, 2)
        if cache is not None:  # keys and values of every token so far: [B, H, K, Dh]
            key, value = cache.update(key, value, self.layer_idx)

        attention: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, eager_attention_forward
        )
        heads, probs = attention(
            self,
            query,
            key,
            value,
            attention_mask,
            dropout=self.attention_dropout if self.training else 0.0,
            scaling=self.scaling,
            **kwargs,
        )  # heads [B, S, H, Dh]
        if head_scale is not None:
            heads = heads * head_scale[:, None]  # [H, 1] broadcasts over each head's Dh columns
        return self.out_proj(heads.reshape(batch, length, -1)), probs


class NormFormerDecoderLayer(GradientCheckpointingLayer):
    """One Pre-LN layer plus NormFormer's operations, each present only when its switch is on:

        r = x + dropout(attn_ln(c_attn * attention(self_attn_layer_norm(x))))
        y = w_resid * r + dropout(fc2(ffn_layernorm(dropout_act(act(fc1(final_layer_norm(r)))))))

    c_attn acts before or after out_proj as head_scale_placement says."""

    def __init__(self, config: NormFormerConfig, layer_idx: int):
        super().__init__()
        d, f, eps = config.hidden_size, config.intermediate_size, config.layer_norm_eps
        self.num_heads = config.num_attention_heads
        self.dropout = config.dropout
        self.activation_dropout = config.activation_dropout
        self.activation = ACTIVATIONS[config.hidden_act]
        self.head_scale_before = config.head_scale_placement == "before_out_proj"

        self.self_attn_layer_norm = nn.LayerNorm(d, eps=eps)
        self.self_attn = NormFormerAttention(config, layer_idx)
        self.c_attn = nn.Parameter(torch.ones(self.num_heads)) if config.scale_heads else None
        self.attn_ln = nn.LayerNorm(d, eps=eps) if config.scale_attn else None
        self.final_layer_norm = nn.LayerNorm(d, eps=eps)
        self.fc1 = NormFormerLinear(d, f)
        # Normalises over all F columns (the project computes its statistics across tensor ranks).
        self.ffn_layernorm = nn.LayerNorm(f, eps=eps) if config.scale_fc else None
        self.fc2 = NormFormerLinear(f, d)
        self.w_resid = nn.Parameter(torch.ones(d)) if config.scale_resids else None

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> torch.Tensor:
        """hidden_states [B, S, d] -> [B, S, d]."""
        attn, _ = self.self_attn(
            self.self_attn_layer_norm(hidden_states),
            attention_mask,
            head_scale=self.c_attn if self.head_scale_before else None,
            cache=cache,
            **kwargs,
        )
        if self.c_attn is not None and not self.head_scale_before:
            # out_proj's output viewed as [B, S, H, Dh], head h's Dh columns times c_attn[h].
            attn = (attn.unflatten(-1, (self.num_heads, -1)) * self.c_attn[:, None]).flatten(-2)
        if self.attn_ln is not None:
            attn = self.attn_ln(attn)
        attn = nn.functional.dropout(attn, p=self.dropout, training=self.training)
        residual = hidden_states + attn

        ffn = self.activation(self.fc1(self.final_layer_norm(residual)))  # [B, S, F]
        ffn = nn.functional.dropout(ffn, p=self.activation_dropout, training=self.training)
        if self.ffn_layernorm is not None:
            ffn = self.ffn_layernorm(ffn)
        ffn = nn.functional.dropout(self.fc2(ffn), p=self.dropout, training=self.training)
        if self.w_resid is not None:
            residual = self.w_resid * residual
        return residual + ffn


# RoBERTa's initialisation (fairseq's init_bert_params): the standard deviation of every Linear
# weight and embedding of a masked LM.
BERT_INIT_STD = 0.02


class NormFormerLMHead(nn.Module):
    """RoBERTa's LM head (fairseq's RobertaLMHead, docs/design.md section 4.8), on the final
    LayerNorm's output h [B, S, d]:

        logits = layer_norm(act(dense(h))) weight^T + bias            [B, S, V]

    with `weight` [V, d] the token embedding itself when tie_word_embeddings (not stored), else
    its own matrix, and `bias` [V]."""

    def __init__(self, config: NormFormerConfig):
        super().__init__()
        d = config.hidden_size
        self.dense = NormFormerLinear(d, d)
        self.activation = ACTIVATIONS[config.hidden_act]
        self.layer_norm = nn.LayerNorm(d, eps=config.layer_norm_eps)
        self.weight = nn.Parameter(torch.empty(config.vocab_size, d))
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        features = self.layer_norm(self.activation(self.dense(hidden_states)))  # [B, S, d]
        return nn.functional.linear(features, self.weight, self.bias)


class NormFormerPreTrainedModel(PreTrainedModel):
    config: NormFormerConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["NormFormerDecoderLayer"]
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _supports_attention_backend = True
    _can_record_outputs = {
        "hidden_states": NormFormerDecoderLayer,
        "attentions": NormFormerAttention,
    }

    @torch.no_grad()
    def _init_weights(self, module: nn.Module):
        """A fresh model starts as the project's does (docs/design.md section 4.5; a masked LM as
        RoBERTa's init_bert_params, section 4.8). transformers calls this on each module that
        holds parameters of its own, and the `init` functions leave tensors loaded from a
        checkpoint alone."""
        d = self.config.hidden_size
        if self.config.objective == "masked_lm" and isinstance(
                module, (NormFormerLinear, nn.Embedding, NormFormerLMHead)):
            # init_bert_params: every Linear weight, embedding and the untied projection (the LM
            # head's weight) N(0, 0.02), biases (the LM head's output bias too) 0.
            init.normal_(module.weight, std=BERT_INIT_STD)
            if not isinstance(module, nn.Embedding):
                init.zeros_(module.bias)
        elif isinstance(module, NormFormerLinear):
            bound = module.in_features**-0.5
            if module.xavier_gain is None:
                init.uniform_(module.weight, -bound, bound)
            else:
                init.xavier_uniform_(module.weight, gain=module.xavier_gain)
            if module.zero_bias:
                init.zeros_(module.bias)
            else:
                init.uniform_(module.bias, -bound, bound)
        elif isinstance(module, nn.Linear):  # the LM head (when tied, the embedding again)
            init.normal_(module.weight, std=d**-0.5)
        elif isinstance(module, nn.Embedding):  # tokens and learned positions
            init.normal_(module.weight, std=d**-0.5)
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, NormFormerDecoderLayer):
            for scale in (module.c_attn, module.w_resid):
                if scale is not None:
                    init.ones_(scale)
        elif isinstance(module, NormFormerSinusoidalPositions):
            init.copy_(module.table, sinusoidal_table(module.rows, module.dim))


class NormFormerModel(NormFormerPreTrainedModel):
    """The decoder (a masked LM's encoder): embeddings, layers, final LayerNorm; returns the last
    hidden states."""

    def __init__(self, config: NormFormerConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.embed_scale = math.sqrt(config.hidden_size) if config.scale_embedding else 1.0
        if config.position_embedding_type == "learned":
            self.embed_positions = NormFormerLearnedPositions(config)
        else:
            self.embed_positions = NormFormerSinusoidalPositions(config)
        self.layers = nn.ModuleList(
            [NormFormerDecoderLayer(config, i) for i in range(config.num_hidden_layers)]
        )
        self.layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.gradient_checkpointing = False
        self.post_init()

    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    @merge_with_config_defaults
    @capture_outputs
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> BaseModelOutputWithPast:
        """input_ids [B, S] or inputs_embeds [B, S, d] (embed_tokens' rows, scaled here either way);
        attention_mask [B, K] with 0 at padding; position_ids [B, S] counted from 0 (first_position
        is added here). Without position_ids a token's position is the number of real tokens
        before it, so a left-padded prompt is numbered as it would be alone. A masked LM's tokens
        attend every token that attention_mask does not mark as padding, and it keeps no cache."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Specify exactly one of input_ids and inputs_embeds")
        causal = self.config.objective == "causal_lm"
        if not causal and cache is not None:
            raise ValueError("A masked LM (objective masked_lm) attends both ways: it has no cache")
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)  # [B, S, d]
        if causal and use_cache and cache is None:
            cache = DynamicCache(config=self.config)
        length = inputs_embeds.shape[1]

        if position_ids is None:
            if attention_mask is not None and attention_mask.ndim == 2:
                # attention_mask covers the cached tokens too: keep the last S counts.
                position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, -length:]
            else:
                past = cache.get_seq_length() if cache is not None else 0
                position_ids = torch.arange(past, past + length, device=inputs_embeds.device)
                position_ids = position_ids[None, :]

        make_mask = create_causal_mask if causal else create_bidirectional_mask
        mask = make_mask(
            config=self.config,
            inputs_embeds=inputs_embeds,
            attention_mask=attention_mask,
            cache=cache,
            position_ids=position_ids,
        )

        # [B or 1, S, d]: row position + first_position of the table.
        positions = self.embed_positions(position_ids + self.config.first_position)
        hidden_states = inputs_embeds * self.embed_scale + positions.to(inputs_embeds.dtype)
        hidden_states = nn.functional.dropout(
            hidden_states, p=self.config.dropout, training=self.training
        )
        for layer in self.layers:
            hidden_states = layer(hidden_states, attention_mask=mask, cache=cache, **kwargs)
        hidden_states = self.layer_norm(hidden_states)
        return BaseModelOutputWithPast(last_hidden_state=hidden_states, cache=cache)


class NormFormerForCausalLM(NormFormerPreTrainedModel, GenerationMixin):
    """NormFormerModel plus the LM head: the token embedding itself when tie_word_embeddings (no
    lm_head.weight stored), else its own [V, d] matrix."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: NormFormerConfig):
        super().__init__(config)
        if config.objective != "causal_lm":
            raise ValueError(f"NormFormerForCausalLM needs objective causal_lm, not "
                             f"{config.objective}: use NormFormerForMaskedLM")
        self.model = NormFormerModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        **kwargs: Unpack[TransformersKwargs],
    ) -> CausalLMOutputWithPast:
        """As NormFormerModel.forward; labels [B, S] (-100 ignored) give the mean cross-entropy of
        predicting token t + 1 from tokens up to t; logits [B, S', V] for the last
        logits_to_keep positions (0: all)."""
        outputs: BaseModelOutputWithPast = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            **kwargs,
        )
        hidden_states = slice_logits_to_keep(outputs.last_hidden_state, logits_to_keep)
        logits = self.lm_head(hidden_states)

        loss = None
        if labels is not None:
            loss = self.loss_function(
                logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs
            )
        return CausalLMOutputWithPast(
            loss=loss,
            logits=logits,
            cache=outputs.cache,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )


class NormFormerForMaskedLM(NormFormerPreTrainedModel):
    """A masked LM (config.objective "masked_lm"): NormFormerModel attending both ways plus
    RoBERTa's head `lm_head` (NormFormerLMHead), whose projection is the token embedding when
    tie_word_embeddings (no lm_head.weight stored)."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: NormFormerConfig):
        super().__init__(config)
        if config.objective != "masked_lm":
            raise ValueError(f"NormFormerForMaskedLM needs objective masked_lm, not "
                             f"{config.objective}: use NormFormerForCausalLM")
        self.model = NormFormerModel(config)
        self.lm_head = NormFormerLMHead(config)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> MaskedLMOutput:
        """As NormFormerModel.forward; logits [B, S, V] at every position; labels [B, S] (-100
        ignored: the tokens not chosen for masking) give the mean cross-entropy of predicting
        each labelled position's token."""
        outputs: BaseModelOutputWithPast = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            use_cache=False,
            **kwargs,
        )
        logits = self.lm_head(outputs.last_hidden_state)

        loss = None
        if labels is not None:
            loss = self.loss_function(
                logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs
            )
        return MaskedLMOutput(
            loss=loss,
            logits=logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )


__all__ = [
    "NormFormerForCausalLM",
    "NormFormerForMaskedLM",
    "NormFormerModel",
    "NormFormerPreTrainedModel",
]
