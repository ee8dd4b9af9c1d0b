"""One module per tool-call format, each defining `FORMAT`; `registry` lists them."""
