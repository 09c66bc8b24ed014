"""NormFormer model configuration, the Hugging Face side of the project's ModelConfig.

`nf-ckpt export --format hf` writes config.json with these keys; each default equals the default of
the ModelConfig field it comes from (model/model_config.proto), so a config.json naming only what
differs describes the same model as a config file naming only what differs. The layer math is
docs/design.md section 4.
"""
from typing import Literal

from huggingface_hub.dataclasses import strict
from transformers import PreTrainedConfig
from transformers.utils.type_validators import interval


@strict
class NormFormerConfig(PreTrainedConfig):
    r"""
    Configuration of a [`NormFormerModel`] (ModelConfig field in brackets).

    Args:
        objective (`str`, defaults to `"causal_lm"`): `"causal_lm"`, a decoder whose tokens attend
            the tokens before them ([`NormFormerForCausalLM`]), or `"masked_lm"`, an encoder whose
            tokens attend every token of the sequence, under RoBERTa's LM head
            ([`NormFormerForMaskedLM`]) [objective].
        mask_token_id (`int`, *optional*): a masked LM's <mask> id, in [0, vocab_size)
            [mask_token, -1 resolved to vocab_size - 1]; none for a causal LM.
        vocab_size (`int`, defaults to 8192): the real vocabulary, without the rows the project pads
            its tables with [vocab_size].
        hidden_size (`int`, defaults to 128): d [d_model].
        num_hidden_layers (`int`, defaults to 4): [num_layers].
        num_attention_heads (`int`, defaults to 4): H; the head size is hidden_size / H [num_heads].
        intermediate_size (`int`, defaults to 512): F, the feed-forward width [ffn_dim].
        max_position_embeddings (`int`, defaults to 128): the longest sequence, prompt and
            generated tokens together [max_seq_len].
        position_embedding_type (`str`, defaults to `"sinusoidal"`): `"sinusoidal"` (fairseq's
            table, computed) or `"learned"` (a stored [max_position_embeddings + first_position, d]
            table) [positions].
        first_position (`int`, defaults to 2): token t of a sequence is position t + first_position
            (2 is fairseq's numbering) [first_position].
        hidden_act (`str`, defaults to `"gelu"`): `"gelu"` (erf form), `"gelu_tanh"` or
            `"relu_squared"` [activation].
        layer_norm_eps (`float`, defaults to 1e-5): every LayerNorm's epsilon [layer_norm_eps].
        scale_embedding (`bool`, defaults to `True`): token embeddings times sqrt(hidden_size)
            [scale_embedding].
        tie_word_embeddings (`bool`, defaults to `True`): the LM head is the token embedding
            [tie_embeddings].
        scale_attn (`bool`, defaults to `True`): LayerNorm `attn_ln` on the attention output
            [normformer.scale_attn].
        scale_heads (`bool`, defaults to `True`): one learned scale `c_attn` per head
            [normformer.scale_heads].
        head_scale_placement (`str`, defaults to `"before_out_proj"`): where `c_attn` acts: on each
            head's attention output (`"before_out_proj"`) or on the output projection's result
            viewed as heads (`"after_out_proj"`, fairseq's placement)
            [normformer.head_scale_placement].
        scale_fc (`bool`, defaults to `True`): LayerNorm `ffn_layernorm` over the F columns after
            the activation [normformer.scale_fc].
        scale_resids (`bool`, defaults to `False`): the feed-forward residual scaled by the learned
            `w_resid` [normformer.scale_resids].
        dropout (`float`, defaults to 0.1): on the embeddings and both residual branches [dropout].
        attention_dropout (`float`, defaults to 0.0): on the attention probabilities
            [attention_dropout].
        activation_dropout (`float`, defaults to 0.0): after the feed-forward activation
            [activation_dropout].
        use_cache (`bool`, defaults to `True`): return the keys and values for generation (a
            causal LM's; a masked LM keeps none).
        bos_token_id, eos_token_id (`int`, *optional*): the end-of-document token, if the export
            named a tokenizer.
        pad_token_id (`int`, *optional*): none: the project never trains on padding.
    """

    model_type = "normformer"

    objective: Literal["causal_lm", "masked_lm"] = "causal_lm"
    mask_token_id: int | None = None
    vocab_size: int = 8192
    hidden_size: int = 128
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    intermediate_size: int = 512
    max_position_embeddings: int = 128
    position_embedding_type: Literal["sinusoidal", "learned"] = "sinusoidal"
    first_position: int = 2
    hidden_act: Literal["gelu", "gelu_tanh", "relu_squared"] = "gelu"
    layer_norm_eps: float | int = 1e-5
    scale_embedding: bool = True
    tie_word_embeddings: bool = True
    scale_attn: bool = True
    scale_heads: bool = True
    head_scale_placement: Literal["before_out_proj", "after_out_proj"] = "before_out_proj"
    scale_fc: bool = True
    scale_resids: bool = False
    # JSON writes 0.0 as 0 in some writers: ints are accepted where a float is meant.
    dropout: float | int = interval(min=0.0, max=1.0, exclude_max=True)(default=0.1)
    attention_dropout: float | int = interval(min=0.0, max=1.0, exclude_max=True)(default=0.0)
    activation_dropout: float | int = interval(min=0.0, max=1.0, exclude_max=True)(default=0.0)
    use_cache: bool = True
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | None = None

    def validate_architecture(self):
        """Shapes the layer math needs; the enum strings are checked by their Literal types."""
        super().validate_architecture()
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "intermediate_size", "max_position_embeddings"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.hidden_size % self.num_attention_heads != 0:
            raise ValueError(f"hidden_size ({self.hidden_size}) must be a multiple of "
                             f"num_attention_heads ({self.num_attention_heads})")
        if self.first_position < 0:
            raise ValueError(f"first_position must be 0 or more, got {self.first_position}")
        if not self.layer_norm_eps > 0:
            raise ValueError(f"layer_norm_eps must be positive, got {self.layer_norm_eps}")
        if self.objective == "masked_lm" and not (
                self.mask_token_id is not None and 0 <= self.mask_token_id < self.vocab_size):
            raise ValueError(f"mask_token_id must be an id of [0, vocab_size {self.vocab_size}) "
                             f"for objective masked_lm, got {self.mask_token_id}")


__all__ = ["NormFormerConfig"]
