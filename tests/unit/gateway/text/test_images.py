"""The gateway's expansion of a vision-language model's image placeholders counts a prompt exactly
as the model's own transformers processor tokenizes it."""

from __future__ import annotations

from pathlib import Path

from PIL import Image

from gateway.text.images import image_expander, takes_images
from tests.support.tokenizers import loaded_tokenizer


def test_gemma3_prompt_counts_equal_the_processors(tiny_gemma3_vlm_dir: Path, tiny_bpe_dir: Path) -> None:
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(str(tiny_gemma3_vlm_dir))
    tokenizer = processor.tokenizer
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "image"},
                {"type": "text", "text": "Compare"},
                {"type": "image"},
                {"type": "text", "text": "this."},
            ],
        }
    ]
    prompt = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    images = [Image.new("RGB", (40, 28), (200, 10, 10)), Image.new("RGB", (9, 70), (0, 90, 10))]
    want = processor(text=prompt, images=images, add_special_tokens=False)["input_ids"][0]
    expand = image_expander(tiny_gemma3_vlm_dir)
    assert expand is not None and takes_images(tiny_gemma3_vlm_dir)
    assert tokenizer.encode(expand(prompt, images), add_special_tokens=False) == list(want)
    # A text prompt (no images) is left as it is.
    assert expand("<start_of_image>", []) == "<start_of_image>"
    # A text-only checkpoint has no expansion.
    assert image_expander(tiny_bpe_dir) is None and not takes_images(tiny_bpe_dir)


def test_a_vision_language_checkpoints_context_is_its_text_models(tiny_gemma3_vlm_dir: Path) -> None:
    from transformers import AutoConfig, AutoTokenizer

    # The checkpoint's limits sit in text_config (its top level has none); the tokenizer's own
    # model_max_length says more than the model takes.
    text_config = AutoConfig.from_pretrained(tiny_gemma3_vlm_dir).get_text_config()
    tokenizer = loaded_tokenizer(tiny_gemma3_vlm_dir)
    assert tokenizer.info.max_model_len == text_config.max_position_embeddings
    assert tokenizer.info.max_model_len < AutoTokenizer.from_pretrained(tiny_gemma3_vlm_dir).model_max_length
