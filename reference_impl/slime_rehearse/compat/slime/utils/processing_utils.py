"""slime compatibility module (slime.utils.processing_utils), backed by slime-ref.
Used by `slime-check smoke --with slime-ref` when slime is not importable.
Its names are listed in skill/references/smoke.md.

Only the tokenizer loader: the image helpers (``build_processor_kwargs``,
``encode_image_for_rollout_engine``, ...) serve vision-language models, which slime-ref does not build;
importing one raises an ImportError that says so."""

from slime_rehearse.compat._exports import exports


def load_tokenizer(name_or_path: str, **kwargs):
    """The Hugging Face tokenizer at ``name_or_path`` (``AutoTokenizer.from_pretrained``), as slime's."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(name_or_path, **kwargs)


__all__, __getattr__ = exports(__name__, "load_tokenizer")
