"""Pure text handling: tokenizers, chat templates, incremental detokenizing, stop strings."""
