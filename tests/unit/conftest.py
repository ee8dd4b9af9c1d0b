from tests.support.fixtures import tiny_agent_dir, tiny_bpe_dir, tiny_metaspace_dir  # noqa: F401
from tests.support.redis_server import redis_server, redis_url  # noqa: F401
