"""The harness's own prompt functions for the nf_* tasks of this directory, imported rather than
copied, so that the prompts are lm-evaluation-harness's (0.4.13) and not a rewrite of them."""
from lm_eval.tasks.hellaswag.utils import process_docs as hellaswag_process_docs  # noqa: F401
from lm_eval.tasks.winogrande.preprocess_winogrande import (  # noqa: F401
    doc_to_choice as winogrande_doc_to_choice,
    doc_to_target as winogrande_doc_to_target,
    doc_to_text as winogrande_doc_to_text,
)
