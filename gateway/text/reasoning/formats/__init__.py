"""One module per reasoning format, each defining `FORMAT`; `registry` lists them."""
