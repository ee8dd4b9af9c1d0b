from tests.support.fixtures import tiny_bpe_dir, tiny_metaspace_dir  # noqa: F401
