from tests.support.fixtures import (  # noqa: F401
    tiny_agent_dir,
    tiny_bpe_dir,
    tiny_gemma3_vlm_dir,
    tiny_metaspace_dir,
)
from tests.support.redis_server import redis_server, redis_url  # noqa: F401
